"""What conf/ needs resolved in Python — the learning-rate defaults (``${kotune_lr:…}``,
``${kotune_mix_lr:…}``), the packaged data files (``${kotune_data:demo/train.tsv}``), search ranges
around a default (``${kotune_log_range:…}``) and sweep job directories (``${kotune_job_dir:…}``) —
registered when this module is imported (the command line, the Python API's compose and the plug-in
loader import it before Hydra composes conf/), and where the config lives."""
from __future__ import annotations

import os

from omegaconf import OmegaConf

import kotune_data
from kotune.sweeps.naming import job_dir_name

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")
GROUPS = ("task", "model", "mode", "train", "data")  # the config groups a user picks on the command line


def default_learning_rate(frozen: bool, init: str, recipe: float, mode_rate: float | None = None) -> float:
    """``train.learning_rate``'s default (conf/train/default.yaml): the mode's own
    (``mode.learning_rate``: LoRA's adapters train at about ten times fine-tuning's rate, SetFit's
    linear head at setfit's 1e-2), a head's rate when only a head trains (``mode=frozen``), a rate
    at which a randomly initialised encoder leaves the majority class (``model.init=random``; 5e-5
    does not: measured on hate speech, 34 % vs 57.5 % at 5e-4), else the task's recipe."""
    if mode_rate is not None:  # before frozen's: mode=setfit trains a head only, at a rate of its own
        return float(mode_rate)
    if frozen:
        return 1.0e-3
    if init == "random":
        return 5.0e-4
    return float(recipe)


def default_mix_learning_rate(learning_rate: float) -> float:
    """The scalar mix's default rate: never slower than the rest, at least 1e-3 (at fine-tuning's
    5e-5 its weights barely leave uniform: 0.086 vs 0.077 after 2,344 NLI steps; 0.42 at 1e-3)."""
    return max(float(learning_rate), 1.0e-3)


def log_range(default: float, low: float, high: float) -> str:
    """An Optuna log-uniform range from ``low`` to ``high`` times ``default`` (conf/hparams_search/:
    around ``train.learning_rate``'s resolved default, so a random or tiny encoder at 5e-4 and a
    pretrained one at 5e-5 are each searched around their own rate)."""
    return f"tag(log, interval({float(default) * low:.3g}, {float(default) * high:.3g}))"


OmegaConf.register_new_resolver("kotune_lr", default_learning_rate, replace=True)
OmegaConf.register_new_resolver("kotune_mix_lr", default_mix_learning_rate, replace=True)
OmegaConf.register_new_resolver("kotune_data", kotune_data.data_path, replace=True)  # data=demo
OmegaConf.register_new_resolver("kotune_log_range", log_range, replace=True)
OmegaConf.register_new_resolver("kotune_job_dir", job_dir_name, replace=True)  # hydra.sweep.subdir
