"""Abstention (``predict.min_confidence``): a single-label prediction whose top probability is under
the threshold is answered "abstain". Pure functions of plain lists: which rows abstain, the share
answered (coverage), and the risk–coverage curve (the error rate of the answered rows at every
threshold, from answering everything down to the single most confident group).

Conventions: a row abstains when its confidence is *strictly* below the threshold (so 0 abstains
nothing, and a row exactly at the threshold is answered); rows with equal confidence are answered
or abstained together (no threshold separates them), so the curve has one point per distinct
confidence, most confident first; risk = 1 - accuracy of the answered rows; coverage 0 has no risk
(None)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from kotune.core.errors import ConfigError

ABSTAIN = "abstain"  # the prediction field of an abstained row (predictions.jsonl, the server)
MAX_CURVE_POINTS = 50  # results.json's curve: at most this many points of the exact curve
REPORT_FIELDS = ("min_confidence", "n", "answered", "coverage", "accuracy", "risk", "metrics", "aurc", "curve",
                 "plot")


class Assessed(NamedTuple):
    """A split's predictions under ``predict.min_confidence``: per row, whether it abstains;
    results.json's ``abstention`` entry; the exact risk–coverage curve (empty without gold labels)."""

    flags: list[bool] | None
    entry: dict | None
    curve: list[dict]


def checked_threshold(value, task) -> float | None:
    """``predict.min_confidence`` checked (None: off): a number in [0, 1], for a task that can abstain
    (``Task.abstention_refusal``); else one line. Every action that builds a task asks it first."""
    if value is None:
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        p = math.nan
    if isinstance(value, bool) or not 0.0 <= p <= 1.0:
        raise ConfigError(f"predict.min_confidence={value}: a probability in [0, 1] (null: never abstain)")
    why = task.abstention_refusal()
    if why:
        raise ConfigError(f"predict.min_confidence={value}: task {task.name} {why}")
    return p


def abstains(confidences: Sequence[float], threshold: float) -> list[bool]:
    """Per row, whether it abstains: its confidence strictly below ``threshold``."""
    return [float(c) < float(threshold) for c in confidences]


def assess(p: float | None, task, outputs: list[Any], examples: list[dict], scored: bool) -> Assessed:
    """The predictions under the threshold ``p`` (``Built.min_confidence``; None: off, no flags and
    no entry): which rows abstain, and results.json's ``abstention`` entry with every field present,
    None where it does not apply (no gold labels: no accuracy, curve or plot; the caller adds the plot)."""
    if p is None:
        return Assessed(None, None, [])
    top = task.top_predictions(outputs)
    flags = abstains([conf for _, conf in top], p)
    entry: dict[str, Any] = dict.fromkeys(REPORT_FIELDS)
    entry.update(min_confidence=p, n=len(flags), answered=sum(not f for f in flags), coverage=coverage(flags))
    if not scored or not all("label" in ex for ex in examples):
        return Assessed(flags, entry, [])
    correct = [label == str(ex["label"]) for (label, _), ex in zip(top, examples)]
    entry["risk"] = risk(correct, flags)
    entry["accuracy"] = None if entry["risk"] is None else 100.0 * (1.0 - entry["risk"])  # ×100, as metrics
    kept = [i for i, f in enumerate(flags) if not f]
    if kept:
        entry["metrics"] = task.score([outputs[i] for i in kept], [examples[i] for i in kept])
    curve = risk_coverage_curve([conf for _, conf in top], correct)
    entry["aurc"] = area_under_curve(curve)
    entry["curve"] = thin(curve)
    return Assessed(flags, entry, curve)


def abstained(threshold: float | None, task, outputs: list) -> list[bool] | None:
    """Per output, whether it abstains under ``threshold`` (the task's top predictions'
    probabilities: ``Task.top_predictions``); None when off."""
    if threshold is None:
        return None
    return abstains([conf for _, conf in task.top_predictions(outputs)], threshold)


def mark(records: list[dict], flags: list[bool] | None) -> list[dict]:
    """The records with ``abstained`` (after ``prediction``); an abstained one's prediction is
    "abstain" and the model's label moves to ``model_prediction``. ``flags`` None: unchanged."""
    if flags is None:
        return records
    out = []
    for record, flag in zip(records, flags):
        new = {}
        for key, value in record.items():
            if key == "prediction" and flag:
                new.update(prediction=ABSTAIN, model_prediction=value)
            else:
                new[key] = value
            if key == "prediction":
                new["abstained"] = flag
        out.append(new)
    return out


def coverage(abstained: Sequence[bool]) -> float | None:
    """The share of rows answered (None for no rows)."""
    return None if not abstained else sum(not a for a in abstained) / len(abstained)


def risk(correct: Sequence[bool], abstained: Sequence[bool]) -> float | None:
    """The error rate of the answered rows (None when none is answered)."""
    answered = [c for c, a in zip(correct, abstained) if not a]
    return None if not answered else 1.0 - sum(map(bool, answered)) / len(answered)


def risk_coverage_curve(confidences: Sequence[float], correct: Sequence[bool]) -> list[dict]:
    """The exact curve: one point per distinct confidence ``c`` (descending), for the threshold
    ``c`` (rows at ``c`` or above answered): ``{"min_confidence": c, "coverage", "risk"}``."""
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences, {len(correct)} correctness flags")
    n = len(confidences)
    order = sorted(range(n), key=lambda i: -float(confidences[i]))
    points, answered, errors = [], 0, 0
    for k, i in enumerate(order):
        answered += 1
        errors += not correct[i]
        last_of_group = k + 1 == n or float(confidences[order[k + 1]]) != float(confidences[i])
        if last_of_group:
            points.append({"min_confidence": float(confidences[i]), "coverage": answered / n,
                           "risk": errors / answered})
    return points


def thin(points: list[dict], max_points: int = MAX_CURVE_POINTS) -> list[dict]:
    """At most ``max_points`` points of ``points`` (the curve), the first and last kept, the rest
    the points nearest evenly spaced coverages: a small list that stays on the exact curve."""
    if len(points) <= max_points:
        return list(points)
    lo, hi = points[0]["coverage"], points[-1]["coverage"]
    keep, j = [], 0
    for step in range(max_points):
        target = lo + (hi - lo) * step / (max_points - 1)
        while j + 1 < len(points) and abs(points[j + 1]["coverage"] - target) <= abs(points[j]["coverage"] - target):
            j += 1
        if not keep or keep[-1] is not points[j]:
            keep.append(points[j])
    return keep


def area_under_curve(points: list[dict]) -> float | None:
    """The area under the risk–coverage curve (AURC; lower is better): the mean of the risks at
    each answered row's coverage, each group of equal confidence counted once per row."""
    if not points:
        return None
    area, previous = 0.0, 0.0
    for p in points:
        area += p["risk"] * (p["coverage"] - previous)
        previous = p["coverage"]
    return area
