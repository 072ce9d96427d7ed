"""A document's logits from its windows' (``task.long_text=windows``; the windows come from
tasks/windows.py, flattened into one batch by the collator with ``window_doc``, the document each
window belongs to): the head classifies every window, and the document's logits are the mean or
the max of its windows' — in training too, so the loss is the document's.

Memory stays bounded by ``max_per_batch`` windows whatever the documents' lengths: the encoder
and head read the batch's windows that many at a time, and in training each such chunk is
checkpointed (``torch.utils.checkpoint``: its activations are recomputed in the backward pass,
with the same dropout), so only the windows' logits of the whole batch are kept.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint


def pool_windows(logits: torch.Tensor, window_doc: torch.Tensor, pool: str) -> torch.Tensor:
    """[windows, labels] → [documents, labels]: the mean or max over each document's windows
    (documents numbered 0…D-1 in ``window_doc``, each with at least one window)."""
    window_doc = window_doc.long()
    docs = int(window_doc.max()) + 1
    index = window_doc.unsqueeze(-1).expand_as(logits)
    empty = logits.new_zeros(docs, logits.size(-1))
    if pool == "max":
        return empty.scatter_reduce(0, index, logits, reduce="amax", include_self=False)
    if pool == "mean":
        return empty.scatter_reduce(0, index, logits, reduce="mean", include_self=False)
    raise ValueError(f"window pool must be mean or max, got {pool!r}")


def in_chunks(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor | None], size: int,
              recompute: bool) -> torch.Tensor:
    """``fn(*inputs)`` over the first axis ``size`` rows at a time, concatenated; ``recompute``
    (training) checkpoints each chunk when there is more than one."""
    rows = inputs[0].size(0)
    if rows <= size:
        return fn(*inputs)
    outputs = []
    for start in range(0, rows, size):
        part = [x[start:start + size] if x is not None else None for x in inputs]
        outputs.append(checkpoint(fn, *part, use_reentrant=False) if recompute else fn(*part))
    return torch.cat(outputs)
