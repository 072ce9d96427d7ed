"""``train.early_stopping_patience=N``: transformers' ``EarlyStoppingCallback`` on kotune's
evaluations — training stops once the task's main metric has not improved (by more than
``train.early_stopping_threshold``) for N evaluations in a row.

It needs what ``train.select_best`` sets up (evaluation ``train.evals_per_epoch`` times per epoch,
checkpoints at the same steps, the best one kept and loaded at the end) and refuses without it
rather than switch it on behind the config's back. The callback is stateful: its patience counter
is saved in every checkpoint (``TrainerState.stateful_callbacks``) and restored on resume
(``restore_callback_states_from_checkpoint``), so a killed run stops where an uninterrupted one does;
a checkpoint saved at the stop is marked finished (``kotune.training.resume``), so rerunning a stopped run
gives its results again instead of training on.
"""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.core.errors import ConfigError
from kotune.core.log import log


def patience(cfg: DictConfig) -> int | None:
    """``train.early_stopping_patience``, checked; None when off."""
    value = cfg.train.get("early_stopping_patience")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"train.early_stopping_patience must be a whole number of evaluations (1 or more), "
                          f"got {value!r}")
    if not cfg.train.get("select_best"):
        raise ConfigError(f"train.early_stopping_patience={value} needs train.select_best=true (evaluations during "
                          "training and the best checkpoint kept), e.g. train=klue; train.evals_per_epoch sets how "
                          "often it evaluates")
    return value


def threshold(cfg: DictConfig) -> float:
    value = float(cfg.train.get("early_stopping_threshold") or 0.0)
    if value < 0:
        raise ConfigError(f"train.early_stopping_threshold must be 0 or more, got {value}")
    return value


def training_arguments(cfg: DictConfig) -> dict:
    """What ``TrainingArguments`` needs besides select_best's: the callback's state restored on resume."""
    return {"restore_callback_states_from_checkpoint": True} if patience(cfg) else {}


def callbacks(cfg: DictConfig) -> list:
    from transformers import EarlyStoppingCallback

    n = patience(cfg)
    return [EarlyStoppingCallback(early_stopping_patience=n, early_stopping_threshold=threshold(cfg))] if n else []


def has_stopped(trainer) -> bool:
    """Did early stopping end the training (its patience used up)? A stop for another reason (a
    callback of the user's, a test's interruption) is no finished run: a rerun resumes it."""
    from transformers import EarlyStoppingCallback

    return any(isinstance(cb, EarlyStoppingCallback) and cb.early_stopping_patience_counter >= cb.early_stopping_patience
               for cb in trainer.callback_handler.callbacks)


def report(trainer, cfg: DictConfig) -> dict | None:
    """results.json's ``early_stopping``: where training stopped, the steps it was given, whether it
    stopped early, the evaluations made (the best step is ``best_step``); None when off."""
    n = patience(cfg)
    if not n:
        return None
    state = trainer.state
    metric = f"eval_{trainer.args.metric_for_best_model}"
    stopped_early = state.global_step < state.max_steps
    if stopped_early:
        log(f"early stopping: {metric[5:]} did not improve by more than {threshold(cfg)} for {n} evaluations in "
            f"a row: stopped at step {state.global_step} of {state.max_steps} (best step {state.best_global_step})")
    return {"patience": n, "threshold": threshold(cfg), "stopped_step": state.global_step,
            "max_steps": state.max_steps, "stopped_early": stopped_early,
            "evaluations": sum(1 for h in state.log_history if metric in h)}
