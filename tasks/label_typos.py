"""A label far rarer than the others in a training file whose label set is learned from it: most
often a typo (one ``긍졍`` among thousands of ``긍정``/``부정`` rows), which would otherwise become a
class of its own and cost the model its macro F1. Pure functions of the counts; the task warns.

The rule: a label is *rare* when it has at most ``max(1, 1 % of the median label count)`` rows and
the median label has at least ``MIN_MEDIAN`` rows (a small file's singletons are not a signal). Its
closest other label is the one at the fewest edits over characters, Hangul syllables counted as
their Jamo (``긍졍`` → ``긍정``: one Jamo edit), so a misspelt vowel is one edit, not a whole syllable.
"""
from __future__ import annotations

import os
import statistics
import unicodedata
from collections import Counter
from typing import Any, Iterable

from kotune.core.log import warn

RARE_SHARE = 0.01  # at most 1 % of the median label count ...
MIN_MEDIAN = 20  # ... while the median label has at least this many rows
SHOWN_ROWS = 5  # the first rows of a rare label a warning names


def jamo(text: str) -> str:
    """Hangul syllables split into their Jamo (NFD), other characters as they are."""
    return unicodedata.normalize("NFD", text)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions) between two strings."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def closest_label(name: str, others: Iterable[str]) -> tuple[str, int] | None:
    """The other label at the fewest Jamo edits from ``name`` (ties: the first in sorted order)."""
    scored = sorted((edit_distance(jamo(name), jamo(other)), other) for other in others if other != name)
    return (scored[0][1], scored[0][0]) if scored else None


def rare_labels(counts: Counter) -> list[str]:
    """Labels with at most max(1, 1 % of the median count) rows, where the median is ≥ MIN_MEDIAN."""
    if len(counts) < 2:
        return []
    median = statistics.median(counts.values())
    if median < MIN_MEDIAN:
        return []
    limit = max(1.0, RARE_SHARE * median)
    return sorted(name for name, n in counts.items() if n <= limit)


def rare_label_warnings(rows: list[tuple[str, list[str]]], path: str) -> list[str]:
    """One warning per rare label of ``rows`` ((where, its labels) per training row) read from
    ``path``: its count, its first rows, its closest other label, and how to pin the label set."""
    counts: Counter = Counter(name for _, names in rows for name in names)
    rare = rare_labels(counts)
    warnings = []
    common = sorted(name for name in counts if name not in rare)
    median = statistics.median(counts.values()) if counts else 0
    for name in rare:
        where = [f"{os.path.basename(path)}:{w}" for w, names in rows if name in names]
        shown = ", ".join(where[:SHOWN_ROWS]) + (f", … ({len(where)} in all)" if len(where) > SHOWN_ROWS else "")
        close = closest_label(name, common)
        hint = f"; closest label '{close[0]}' ({close[1]} Jamo/character edit{'s' if close[1] != 1 else ''})" \
            if close else ""
        warnings.append(f"{path}: label '{name}' has {counts[name]} row(s) against a median of {median:g} per label "
                        f"(at {shown}){hint}: a typo? It becomes a class of its own; fix the rows, or pin the "
                        f"label set with data.labels=[{','.join(common)}] (other labels are then refused)")
    return warnings


def warn_rare_labels(task: Any, examples: list[dict], path: str) -> None:
    """Warn (the log) of each rare label among a training split's examples (``task.label_rows``:
    (where, labels) per example; tasks without a learned label set give none)."""
    for line in rare_label_warnings(task.label_rows(examples), path):
        warn(line)
