"""The linear-chain CRF of the token head's ``crf=True`` option (``task.crf=true``): pytorch-crf's ``CRF``
(``torchcrf``) scores whole tag sequences — the training loss is its negative log-likelihood,
summed over sentences and divided by the label slots as the cross-entropy of a plain tagging head
is (``heads/loss.py``: the slots of the whole optimizer step under ``train.grad_accum``), and
evaluation decodes with its Viterbi search.

The chain runs over each row's *label slots* only (the positions the task labels and decodes:
a unit's first subword, or every subword with ``task.label_subwords=all``; characters with
``task.decode=char``), packed to the left, so a word's later subwords never sit between two tags.
Moves the tag scheme forbids (``task.crf`` on IOB2 tags: ``I-X`` at the start, after ``O`` or after
another type; ``tasks/transitions.py``) score ``FORBIDDEN``: the learned parameters are masked at
every call (``torch.func.functional_call``), so no optimizer step or weight decay can move them.

In evaluation the head returns ``(viterbi, emissions)``: ``viterbi`` is one-hot on the best
path at the slots (the emissions elsewhere), so the task's decoder reads it with the argmax it
reads any tagging head's logits with; the loss reads the emissions.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torchcrf import CRF

from tasks.base import IGNORE

FORBIDDEN = -1e4  # exp(-1e4) is 0 in float32: a path through a forbidden move has no probability


class _CRF(CRF):
    """pytorch-crf's CRF with one entry point, so that ``functional_call`` can swap in the masked
    transitions for both the likelihood (with tags) and Viterbi decoding (without)."""

    def forward(self, emissions, tags=None, mask=None, reduction="sum"):  # type: ignore[override]
        if tags is None:
            return self.decode(emissions, mask)
        return super().forward(emissions, tags, mask, reduction=reduction)


def chain(slots: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots of each row packed to the left: (positions [B, S], mask [B, S]). S is ``width``
    (at most the row length; the positions past a row's slots are its other positions, masked), or
    by default the most slots of any row (at least 1): a number read from the device."""
    lengths = slots.sum(1)
    if width is None:
        width = max(1, int(lengths.max())) if slots.numel() else 1
    order = torch.sort((~slots).to(torch.uint8), dim=1, stable=True).indices  # slots first, in order
    positions = order[:, :width]
    mask = torch.arange(positions.size(1), device=slots.device)[None, :] < lengths[:, None]
    return positions, mask


class ChainCRF(nn.Module):
    """The CRF over label slots, with the constrained moves masked."""

    def __init__(self, num_labels: int, constraints: dict | None = None):
        super().__init__()
        self.crf = _CRF(num_labels, batch_first=True)
        constraints = constraints or {}
        start = torch.zeros(num_labels, dtype=torch.bool)
        start[list(constraints.get("start") or [])] = True
        moves = torch.zeros(num_labels, num_labels, dtype=torch.bool)
        for i, j in constraints.get("transitions") or []:
            moves[i, j] = True
        # derived from head_kwargs (saved in kotune.json): not part of the weights
        self.register_buffer("forbidden_start", start, persistent=False)
        self.register_buffer("forbidden_moves", moves, persistent=False)

    def parameters_in_force(self) -> dict[str, torch.Tensor]:
        crf = self.crf
        return {"start_transitions": crf.start_transitions.masked_fill(self.forbidden_start, FORBIDDEN),
                "end_transitions": crf.end_transitions,
                "transitions": crf.transitions.masked_fill(self.forbidden_moves, FORBIDDEN)}

    def _packed(self, emissions: torch.Tensor, slots: torch.Tensor, width: int | None = None):
        positions, mask = chain(slots, width)
        packed = torch.gather(emissions.float(), 1, positions.unsqueeze(-1).expand(-1, -1, emissions.size(-1)))
        return positions, mask, packed, mask.any(1)  # rows with at least one slot

    def nll(self, emissions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The negative log-likelihood of the labelled slots' tags (labels -100 elsewhere), summed
        over the rows."""
        slots = labels != IGNORE
        if not slots.numel():  # no positions at all (a shape: known on the host)
            return emissions.sum() * 0.0
        # No number the device holds decides what runs (each would make the host wait every step):
        # the chain spans the whole row (masked steps past a row's slots leave pytorch-crf's scores
        # as they are), and a row without slots, which pytorch-crf refuses (its first step must be
        # on), is scored on a one-step chain and left out of the sum.
        positions, mask, packed, rows = self._packed(emissions, slots, slots.size(1))
        tags = torch.gather(labels.long().clamp(min=0), 1, positions)
        mask = mask | (torch.arange(mask.size(1), device=mask.device) == 0)
        llh = functional_call(self.crf, self.parameters_in_force(), (packed, tags, mask), {"reduction": "none"})
        return -torch.where(rows, llh, 0.0).sum()  # a batch without slots: 0, not NaN

    def viterbi(self, emissions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The emissions with each row's best path written one-hot over its slots."""
        # evaluation reads its paths on the host anyway (pytorch-crf returns lists): a chain as
        # wide as the most slots of any row keeps the Viterbi loop short
        positions, mask, packed, rows = self._packed(emissions, slots)
        out = emissions.detach().float().clone()
        if not rows.any():
            return out
        paths = functional_call(self.crf, self.parameters_in_force(), (packed[rows],), {"mask": mask[rows]})
        for b, path in zip(rows.nonzero().flatten().tolist(), paths):
            where = positions[b, : len(path)]
            out[b, where] = 0.0
            out[b, where, torch.tensor(path, device=out.device)] = 1.0
        return out
