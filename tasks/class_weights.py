"""``train.class_weights=none|balanced|[w1, w2, …]``: what the setting means, checked, and the
balanced weights of the training split's label counts (pure: lists in, lists out)."""
from __future__ import annotations

import math
from typing import Any, Iterable

from omegaconf import ListConfig

from tasks.base import IGNORE
from kotune.core.errors import ConfigError
from kotune.core.log import log

BALANCED = "balanced"


def class_weight_setting(value: Any) -> str | list[float] | None:
    """``train.class_weights`` as None (``none``/null), ``"balanced"`` or a list of weights."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    if isinstance(value, str) and value.lower() == BALANCED:
        return BALANCED
    if isinstance(value, (list, tuple, ListConfig)):
        weights = []
        for w in value:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ConfigError(f"train.class_weights={list(value)}: every weight must be a finite number ≥ 0, "
                                  f"got {w!r}")
            weights.append(float(w))
        if not any(weights):
            raise ConfigError(f"train.class_weights={list(value)}: every weight is 0 (nothing would train)")
        return weights
    raise ConfigError(f"train.class_weights={value!r}: expected none, balanced or a list such as [1.0, 2.5, 3.0] "
                      "(one weight per label, in the task's label order)")


def label_counts(label_ids: Iterable, num_labels: int) -> list[int]:
    """How often each class id is a training target: one id per example (sequence tasks) or a list
    per example (tagging; -100 slots are not targets)."""
    counts = [0] * num_labels
    for row in label_ids:
        for label in (row if isinstance(row, (list, tuple)) else (row,)):
            if label != IGNORE:
                counts[int(label)] += 1
    return counts


def class_weights(setting: str | list[float], labels: list[str], counts: list[int]) -> list[float]:
    """The weight of each label: the list as given (its length checked against the labels), or
    balanced, n / (k · count) over the k labels that occur in training (sklearn's "balanced"): the
    weighted targets then sum to n, as the unweighted ones do. A label that never occurs is never a
    target, so its weight has no effect; it gets 0."""
    if isinstance(setting, list):
        if len(setting) != len(labels):
            shown = ", ".join(map(str, labels)) if len(labels) <= 20 else f"{', '.join(map(str, labels[:20]))}, …"
            raise ConfigError(f"train.class_weights has {len(setting)} weight(s), but the task has {len(labels)} "
                              f"labels ({shown}): give one weight per label, in that order")
        return list(setting)
    n, present = sum(counts), sum(1 for c in counts if c)
    if not n:
        raise ConfigError("train.class_weights=balanced: the training split has no labelled target to count")
    return [n / (present * c) if c else 0.0 for c in counts]


def describe(labels: list[str], weights: list[float], counts: list[int] | None = None) -> str:
    """``label count → weight`` for the log."""
    parts = [f"{name} {counts[i]:,} → {w:.3g}" if counts is not None else f"{name} {w:.3g}"
             for i, (name, w) in enumerate(zip(labels, weights))]
    return ", ".join(parts)


def saved_class_weights(weights: list[float] | None, labels: list[str] | None, asked: bool = False) -> dict | None:
    """The weights a trained head carries, reported as ``{label: {"count", "weight"}}`` (a checkpoint's
    come without counts), None when unweighted; ``asked``: ``train.class_weights`` was set, which
    applies to training only (said once)."""
    if weights is None:
        return None
    if asked:
        log("class weights: the checkpoint's (train.class_weights applies to training)")
    names = [str(x) for x in labels or range(len(weights))]
    return {name: {"count": None, "weight": w} for name, w in zip(names, weights)}
