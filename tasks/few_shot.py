"""``data.examples_per_class=N``: a seeded few-shot training set from any single-label
classification file, N rows of each class (all a class has where it has fewer), as SetFit's and
few-shot papers' experiments draw them. Pure: the same rows, seed and N give the same sample."""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from kotune.core.errors import ConfigError


def check_examples_per_class(value: Any) -> int | None:
    """``data.examples_per_class``: null (off) or a whole number ≥ 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"data.examples_per_class={value}: a whole number ≥ 1 of training rows per class "
                          "(or null: every row)")
    return value


def sample_per_class(examples: list[dict], n: int, seed: int, task_name: str = "") -> tuple[list[dict], dict]:
    """``n`` rows of each class of ``examples`` (a class with fewer: all of them), drawn with
    ``seed`` and kept in file order; and the counts per class (``{label: rows kept}``). Rows carry a
    single string label (``ex["label"]``); a regression or a label set is a ConfigError."""
    by_class: dict[str, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        label = ex.get("label")
        if not isinstance(label, str):
            kind = "no single label" if label is None else f"{type(label).__name__} labels"
            raise ConfigError(f"data.examples_per_class samples each class of a single-label classification: task "
                              f"{task_name or '?'}'s rows carry {kind}")
        by_class[label].append(i)
    rng = random.Random(seed)
    kept: list[int] = []
    counts: dict[str, int] = {}
    for label in sorted(by_class):  # a fixed class order: the draw does not depend on the file's row order of classes
        rows = by_class[label]
        chosen = rows if len(rows) <= n else rng.sample(rows, n)
        kept.extend(chosen)
        counts[label] = len(chosen)
    return [examples[i] for i in sorted(kept)], counts


def sample_note(n: int, counts: dict[str, int], total: int) -> str:
    """The one log line: how many rows of each class were kept, and the classes that had fewer."""
    short = [f"{label} has {k}" for label, k in counts.items() if k < n]
    return (f"data.examples_per_class={n}: {sum(counts.values())} of {total} training rows, {n} of each of "
            f"{len(counts)} classes" + (f" ({'; '.join(short)}: all of them)" if short else ""))
