"""Cross-validation folds (``data.folds=K data.fold=i``): a deterministic partition of the training
examples into K folds of whole groups, the same for every fold's run and every training seed."""
from __future__ import annotations

import random
from typing import Hashable

from omegaconf import DictConfig

from tasks.errors import ConfigError


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


def assign_folds(groups: list[Hashable | None], folds: int, seed: int) -> list[int]:
    """Each row's fold (0..K-1). Rows with the same group (not None) share a fold; a None group is a
    row of its own. The groups are shuffled with ``seed``, then placed largest first, each into the
    fold with the fewest rows so far (ties: the lowest fold), so fold sizes differ by at most the
    largest group's size (by one row when there are no groups)."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(("row", i) if key is None else ("group", key), []).append(i)
    order = list(members.values())
    random.Random(seed).shuffle(order)
    order.sort(key=len, reverse=True)  # stable: equal sizes keep the shuffled order
    sizes, out = [0] * folds, [0] * len(groups)
    for rows in order:
        target = min(range(folds), key=lambda f: (sizes[f], f))
        sizes[target] += len(rows)
        for i in rows:
            out[i] = target
    return out
