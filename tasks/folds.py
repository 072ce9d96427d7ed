"""Cross-validation folds (``data.folds=K data.fold=i``): a deterministic partition of the training
examples into K folds of whole groups, stratified by label (each fold holds each class in about the
file's share), the same for every fold's run and every training seed; and which data selects a
fold's checkpoint (``data.fold_selection``)."""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Hashable

from omegaconf import DictConfig

from kotune.core.errors import ConfigError


def fold_settings(data: DictConfig) -> tuple[int, int] | None:
    """``(K, i)`` from ``data.folds`` and ``data.fold``, checked; None when ``data.folds`` is unset."""
    folds, fold = data.get("folds"), data.get("fold")
    if folds is None:
        if fold is not None:
            raise ConfigError(f"data.fold={fold} needs data.folds=K (how many folds the training data is cut into)")
        return None
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"data.folds={folds}: expected an integer of at least 2")
    if fold is None:
        raise ConfigError(f"data.folds={folds} needs data.fold=0..{folds - 1} (the held-out fold), or all of "
                          f"them: -m data.fold={','.join(map(str, range(folds)))}")
    if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < folds:
        raise ConfigError(f"data.fold={fold}: expected an integer from 0 to {folds - 1} (data.folds={folds})")
    return folds, fold


SELECTIONS = {"fold": "validation fold", "inner": "inner slice of the training folds"}


def fold_selection(data: DictConfig) -> str:
    """``data.fold_selection``, checked: ``fold`` (a fold's checkpoint is selected on the fold it is
    scored on) or ``inner`` (on ``data.inner_split`` of the training folds, held out of training)."""
    value = data.get("fold_selection") or "fold"
    if value not in SELECTIONS:
        raise ConfigError(f"data.fold_selection={value}: expected fold (select on the validation fold) or inner "
                          "(on a seeded slice of the training folds, data.inner_split)")
    if value == "inner" and data.get("folds") is None:
        raise ConfigError("data.fold_selection=inner selects a cross-validation fold's checkpoint: it needs "
                          "data.folds=K data.fold=i")
    return value


def fold_stratum(task: Any, example: dict) -> Hashable | None:
    """What folds are stratified by: a classification example's label, a multi-label example's
    label set; None for a regression target and for tasks without one label per example (NER, QA)."""
    if getattr(task, "regression", False):
        return None
    label = example.get("label")
    if isinstance(label, str):
        return label
    if isinstance(label, list) and getattr(task, "multi_label", False):
        return tuple(sorted(label))
    return None


def assign_folds(groups: list[Hashable | None], folds: int, seed: int,
                 strata: list[Hashable | None] | None = None) -> list[int]:
    """Each row's fold (0..K-1). Rows with the same group (not None) share a fold; a None group is a
    row of its own. The groups are shuffled with ``seed`` and placed largest first.

    Without ``strata`` (or with fewer than two distinct ones) each goes into the fold with the
    fewest rows so far (ties: the lowest fold), so fold sizes differ by at most the largest group's
    size (by one row when there are no groups).

    With ``strata`` (a label per row) each group goes into the fold that most needs what it holds:
    the least ``Σ_c n_gc·n_fc / N_c² + n_g·n_f / N²`` (``n_gc``: the group's rows of class c,
    ``n_fc`` the fold's so far, ``N_c`` the file's; the last term the same for all rows; ties: the
    fewest rows, then the lowest fold), greedily keeping each class's share of each fold near the
    file's. Equal-sized groups are taken class by class, so rows without groups are dealt round
    robin: each class's count per fold, and each fold's size, differ by at most one."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(("row", i) if key is None else ("group", key), []).append(i)
    order = list(members.values())
    random.Random(seed).shuffle(order)
    sizes, out = [0] * folds, [0] * len(groups)
    if strata is None or len(set(strata)) < 2:
        order.sort(key=len, reverse=True)  # stable: equal sizes keep the shuffled order
        for rows in order:
            target = min(range(folds), key=lambda f: (sizes[f], f))
            sizes[target] += len(rows)
            for i in rows:
                out[i] = target
        return out
    keys = {s: k for k, s in enumerate(sorted(set(strata), key=repr))}  # a fixed order of the classes
    total = Counter(keys[s] for s in strata)
    n = len(strata)
    held = [Counter() for _ in range(folds)]
    units = [(rows, Counter(keys[strata[i]] for i in rows)) for rows in order]
    units.sort(key=lambda u: (-len(u[0]), u[1].most_common(1)[0][0]))  # stable: shuffled within
    for rows, classes in units:
        def need(f: int) -> tuple[float, int, int]:
            cost = sum(c * held[f][k] / total[k] ** 2 for k, c in classes.items()) + len(rows) * sizes[f] / n ** 2
            return cost, sizes[f], f
        target = min(range(folds), key=need)
        sizes[target] += len(rows)
        held[target].update(classes)
        for i in rows:
            out[i] = target
    return out
