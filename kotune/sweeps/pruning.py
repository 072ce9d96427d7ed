"""Pruning a sweep's trials (``hparams_search.pruner=median``): the training job reports its main
metric at every evaluation to the Optuna trial it runs for, and stops when the study's pruner says
the trial is worse than the others were at the same point.

Hydra's basic launcher runs each trial's job in the sweeper's own process, so the sweeper hands the
trial over here (``reporting_to``) rather than through the config (another launcher refuses pruning). The step a value is reported at
is the evaluation's number, not the optimizer step: with ``train.evals_per_epoch=4`` evaluation k
comes after k/4 epochs whatever the batch size, so trials with different batch sizes are compared
after the same amount of data. A pruned job ends like a finished one (its best checkpoint so far
predicts the validation split), with ``status: "pruned"`` and ``pruned`` (where, and the values
reported) in results.json; it saves no model."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from omegaconf import DictConfig
from transformers import TrainerCallback


PRUNERS = ("none", "median")


class TrialLink:
    """The trial a job in this process reports to, and where it was pruned (None: it was not)."""

    def __init__(self, trial) -> None:
        self.trial, self.pruned_at = trial, None


_current: dict[str, TrialLink | None] = {"link": None}


@contextlib.contextmanager
def reporting_to(trial) -> Iterator[TrialLink]:
    """Within this block, a training job reports its evaluations to ``trial`` (an optuna Trial)."""
    _current["link"] = link = TrialLink(trial)
    try:
        yield link
    finally:
        _current["link"] = None


def make_pruner(name: str, startup_trials: int, warmup_evaluations: int):
    """optuna's pruner for ``hparams_search.pruner`` (None for none); check ``problem`` first."""
    import optuna

    if name == "none":
        return None
    return optuna.pruners.MedianPruner(n_startup_trials=int(startup_trials), n_warmup_steps=int(warmup_evaluations))


def problem(name: str, cfg: DictConfig, launcher: str) -> str | None:
    """Why ``hparams_search.pruner=name`` cannot prune this sweep's jobs, or None: pruning needs
    evaluations during training, and the job in this process to report them."""
    if name not in PRUNERS:
        return f"hparams_search.pruner must be one of {', '.join(PRUNERS)}, got {name!r}"
    if name == "none":
        return None
    if cfg.action != "train":
        return (f"hparams_search.pruner={name}: action={cfg.action} has no evaluations during training to prune "
                "on (only action=train has); hparams_search.pruner=none")
    if not cfg.train.get("select_best"):
        return (f"hparams_search.pruner={name} needs evaluations during training: train.select_best=true "
                "(e.g. train=klue; train.evals_per_epoch sets how often a trial reports)")
    if launcher != "BasicLauncher":
        return (f"hparams_search.pruner={name} needs the trials' jobs in the sweeper's process (Hydra's basic "
                f"launcher), not {launcher}: for more processes use hparams_search.n_jobs or more workers")
    return None


class PruningCallback(TrainerCallback):
    """Reports ``eval_<metric>`` to the trial after each evaluation; stops training when pruned."""

    def __init__(self, link: TrialLink, metric: str) -> None:
        self.link, self.metric = link, metric
        self.reported: list[float] = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        value = (metrics or {}).get(f"eval_{self.metric}")
        if value is None or self.link.pruned_at is not None:
            return
        self.reported.append(float(value))
        self.link.trial.report(float(value), step=len(self.reported))
        if self.link.trial.should_prune():
            self.link.pruned_at = {"evaluation": len(self.reported), "step": state.global_step,
                                   "max_steps": state.max_steps}
            control.should_training_stop = True


def callbacks(metric: str) -> list[PruningCallback]:
    """The callback for the trial this process runs, if a sweeper with a pruner handed one over."""
    link = _current["link"]
    return [PruningCallback(link, metric)] if link is not None else []


def report(trainer) -> dict | None:
    """results.json's ``pruned``: where the trial stopped and the values it reported; None if it was not pruned."""
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, PruningCallback) and cb.link.pruned_at is not None:
            return {**cb.link.pruned_at, "reported": cb.reported}
    return None
