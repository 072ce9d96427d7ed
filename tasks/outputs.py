"""Checks shared by the tasks' ``outputs_from_predictions`` (action=score reads another system's
predictions into a task's decode() format): labels within the task's label set, tag sequences,
probability rows. Pure functions of plain values; errors name the file."""
from __future__ import annotations

import math
from typing import Any

from kotune.core.errors import DataError

PROBABILITIES = "probabilities"  # per class, beside a predicted label (kotune's RE predictions.jsonl)
SHOWN = 5


def first_few(items) -> str:
    items = list(items)
    more = f", … ({len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(repr(x) for x in items[:SHOWN]) + more


def check_labels(values: list[str], allowed: list[str], path: str, what: str = "label") -> None:
    unknown = sorted({v for v in values if v not in set(allowed)}, key=str)
    if unknown:
        raise DataError(path, None, f"{len(unknown)} unknown {what}(s): {first_few(unknown)} "
                                    f"(the task's {what}s: {first_few(allowed) if len(allowed) > 30 else ', '.join(map(repr, allowed))})")


def parse_tags(value: Any) -> list[str]:
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            import json

            value = json.loads(value)
        else:
            return value.split()
    return [str(t) for t in value]


def probability_row(probs: Any, labels: list[str], path: str, where: str, what: str = "labels") -> list[float]:
    """A row's ``{label: probability}`` as a list in ``labels`` order, every label present, finite."""
    if not isinstance(probs, dict) or set(probs) != set(labels):
        raise DataError(path, None, f"{where}: '{PROBABILITIES}' must map each of the {len(labels)} {what} "
                                    "to its probability")
    try:
        row = [float(probs[name]) for name in labels]
    except (TypeError, ValueError):
        raise DataError(path, None, f"{where}: a probability that is not a number") from None
    if not all(math.isfinite(p) for p in row):
        raise DataError(path, None, f"{where}: a probability that is not finite")
    return row
