"""What kotune adds to Hydra's sweeps: job directories named by the swept values, and searched keys
that another setting makes no-ops.

A sweep job's directory names what the sweep varies (``hydra.sweep.subdir`` in conf/config.yaml):
``multirun/<sweep>/<task>/<model>/<mode>/lr=0.001,seed=1``; an Optuna trial's starts with its number
(``7_lr=0.000354,bs=16,…``: sampled values can repeat once rounded, numbers cannot). The swept keys
are the command line's sweeps (``a,b``, ``choice()``, ``interval()``: ``KOTUNE_SWEPT``, which
``python run.py`` sets, else this process's argv) and the search preset's ``hydra.sweeper.params``.
The same command run again gives the same names, so a rerun sweep finds its finished jobs.

A searched key that another setting overrides (``train.epochs`` under ``train.max_steps=50``) would
vary nothing while the study models it: :func:`drop_shadowed` takes it out of the search with a
one-line warning (hydra_plugins/kotune_sweeper.py calls it before the first trial)."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from kotune.core.log import warn

SWEPT_ENV = "KOTUNE_SWEPT"
IN_PATH = ("task", "model", "mode")  # directories above the job's already name them
SHORT = {"learning_rate": "lr", "batch_size": "bs", "weight_decay": "wd", "warmup_ratio": "warmup",
         "head_dropout": "dropout"}
SAMPLED_DIGITS = 3  # significant digits of a sampled float in a directory name
# how many trials, and how many workers run them: not what a search is, so not in its directory's name
# (the same search with a larger n_trials continues in the same directory, on the same study)
NOT_IN_SWEEP_ID = ("hparams_search.n_trials", "hparams_search.n_jobs")


def swept_keys(argv: list[str]) -> list[str]:
    """The keys of the sweep overrides in ``argv`` (``train.seed=1,2`` → ``train.seed``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")
             and not os.path.exists(a.partition("=")[2])]  # a path with '=' or ',' (a fold's run directory) is no sweep
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def short_names(keys: list[str]) -> dict[str, str]:
    """``train.learning_rate`` → ``lr``, ``train.seed`` → ``seed``; full keys where two would clash."""
    leaf = {k: SHORT.get(k.rpartition(".")[2], k.rpartition(".")[2]) for k in keys}
    return {k: name if list(leaf.values()).count(name) == 1 else k for k, name in leaf.items()}


def shown(value: str, sampled: bool) -> str:
    if sampled:
        try:
            number = float(value)
            if not number.is_integer():
                value = f"{number:.{SAMPLED_DIGITS}g}"
        except ValueError:
            pass
    return value.replace(os.sep, "_")


def job_dir_name(seed) -> str:
    """``${kotune_job_dir:${train.seed}}``: the swept keys' values of this job (``seed=N`` when
    only task, model or mode vary), after the trial number for a sampling sweeper."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return f"seed={seed}"
    hc = HydraConfig.get()
    env = os.environ.get(SWEPT_ENV)
    keys = [k for k in (env.split(",") if env is not None else swept_keys(sys.argv[1:])) if k]
    keys += [str(k) for k in (hc.sweeper.get("params") or {})]
    values = {}
    for override in hc.overrides.task:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in keys and key not in IN_PATH:
            values[key] = value
    sampled = hc.sweeper.get("n_trials") is not None
    names = short_names(list(values))
    leaf = ",".join(f"{names[k]}={shown(v, sampled)}" for k, v in values.items()) or f"seed={seed}"
    return f"{hc.job.num}_{leaf}" if sampled else leaf


# searched key → (the setting that can make it a no-op, when it does: the composed config → why or None)
SHADOWS: dict[str, tuple[str, Callable[[Any], str | None]]] = {
    "train.epochs": ("train.max_steps", lambda c: f"train.max_steps={c.train.max_steps} overrides it (-1: epochs count)"
                     if int(c.train.get("max_steps") or -1) > 0 else None),
    "train.evals_per_epoch": ("train.select_best", lambda c: None if c.train.get("select_best")
                              else "it counts only with train.select_best=true"),
    "train.mix_learning_rate": ("mode.layers", lambda c: None if c.mode.get("layers") == "scalar_mix"
                                else "it counts only with mode.layers=scalar_mix"),
}


def drop_shadowed(config, params, arguments: list[str]) -> tuple[dict[str, str], list[str]]:
    """The search space (``hydra.sweeper.params`` as resolved strings, and the command line's
    arguments) without the keys that ``config`` makes no-ops, each dropped with a one-line
    warning; a key stays when the setting that would shadow it is searched too."""
    swept = set(swept_keys(arguments))
    fixed = {a.partition("=")[0].lstrip("+~") for a in arguments if "=" in a} - swept  # a fixed value is no search
    searched = ({str(k) for k in (params or {})} - fixed) | swept
    dropped = {}
    for key, (setting, why) in SHADOWS.items():
        reason = why(config) if key in searched and setting not in searched else None
        if reason:
            dropped[key] = reason
            warn(f"search space: {key} is not searched: {reason}")
    kept = {str(k): str(v) for k, v in (params or {}).items() if str(k) not in dropped}
    return kept, [a for a in arguments if a.partition("=")[0].lstrip("+~") not in dropped]
