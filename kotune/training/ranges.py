"""The numeric ``train.*`` settings' allowed ranges, one table, checked by kotune/cli/job.py before a job
reads or builds anything: ``train.learning_rate=-1`` or ``=nan``, ``train.batch_size=0``,
``train.max_steps=-5`` are one line naming the key and its range (Trainer would fail deep inside,
reported as a bug, or train 0 steps and report ``status ok``)."""
from __future__ import annotations

import math
from typing import Any, Callable

from omegaconf import DictConfig

from kotune.core.errors import ConfigError


def number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def above(low: float) -> Callable[[Any], bool]:
    return lambda v: number(v) and v > low


def at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: whole(v) and v >= low


def unit(closed_high: bool = False) -> Callable[[Any], bool]:
    return lambda v: number(v) and 0 <= v and (v <= 1 if closed_high else v < 1)


def or_null(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or rule(v)


def or_auto(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or v == "auto" or rule(v)  # null reads as auto (kotune/devices.py)


# key (under train.) → (the value fits, what fits, in words)
TRAIN_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "learning_rate": (above(0), "a finite number > 0"),
    "mix_learning_rate": (above(0), "a finite number > 0"),
    "layer_lr_decay": (lambda v: number(v) and 0 < v <= 1, "a number in (0, 1] (1: off)"),
    "max_steps": (lambda v: v is None or v == -1 or whole(v) and v > 0, "-1 (train.epochs counts) or a whole number > 0"),
    "epochs": (lambda v: number(v) and v >= 0, "a finite number > 0 (0 only with train.max_steps > 0)"),
    "batch_size": (at_least(1), "a whole number >= 1"),
    "batch_tokens": (or_null(at_least(2)), "null or a whole number >= 2 (padded tokens a batch)"),
    "eval_batch_size": (at_least(1), "a whole number >= 1"),
    "grad_accum": (at_least(1), "a whole number >= 1"),
    "warmup_ratio": (unit(), "a number in [0, 1)"),
    "weight_decay": (lambda v: number(v) and v >= 0, "a finite number >= 0"),
    "max_length": (at_least(2), "a whole number >= 2 (room for the special tokens)"),
    "calibrate_fraction": (or_null(lambda v: number(v) and 0 < v < 1), "null or a number in (0, 1)"),
    "head_dropout": (or_null(unit()), "null or a number in [0, 1)"),
    "seed": (lambda v: whole(v) and 0 <= v < 2 ** 32, "a whole number in [0, 2^32)"),
    "evals_per_epoch": (at_least(1), "a whole number >= 1"),
    "early_stopping_patience": (or_null(at_least(1)), "null or a whole number >= 1"),
    "early_stopping_threshold": (lambda v: number(v) and v >= 0, "a finite number >= 0"),
    "save_steps": (at_least(1), "a whole number >= 1"),
    "save_total_limit": (or_null(at_least(1)), "null or a whole number >= 1"),
    "logging_steps": (at_least(1), "a whole number >= 1"),
    "pad_to_multiple_of": (or_auto(at_least(1)), "auto or a whole number >= 1"),
    "dataloader_num_workers": (or_auto(at_least(0)), "auto or a whole number >= 0"),
}


def shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def check_train(cfg: DictConfig) -> None:
    """Each ``train.*`` setting of :data:`TRAIN_RANGES` the config has, against its range (its
    resolved value: a task recipe's or a preset's counts as much as an override); the first that
    does not fit is one :class:`ConfigError` line naming the key, its value and what fits."""
    train = cfg.get("train")
    if train is None:
        return
    for key, (fits, wanted) in TRAIN_RANGES.items():
        if key not in train:
            continue
        value = train.get(key)
        if not fits(value):
            raise ConfigError(f"train.{key}={shown(value)}: {wanted} expected")
    steps = train.get("max_steps")
    if "epochs" in train and train.get("epochs") == 0 and not (whole(steps) and steps > 0):
        raise ConfigError(f"train.epochs=0 with train.max_steps={shown(steps)}: nothing would train "
                          "(train.epochs > 0, or train.max_steps > 0)")
