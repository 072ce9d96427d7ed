"""Losses as sums over counted items, so that one effective batch split into micro-batches
(``train.grad_accum``, data-parallel processes) has exactly the loss and gradients of the whole
batch at once: the mean over *its* labelled items (rows, labelled tokens, masked tokens, pairs).

A head's loss is one or more terms, each a mean over its own items (span heads: the start and the
end position; the dependency head: the arc and the label; BERT pretraining: the masked tokens
and the sentence pairs). A head gives each term's *sum* over a batch (``loss_sums``) and, from the
labels alone, its item count (``loss_counts``). Trainer counts all micro-batches of an optimizer
step before the first forward (kotune/training/trainer.py): the step's loss is then Σ sum / count, with
the counts of the whole step, and no micro-batch's mean is weighted as much as another's whatever
its number of items (the mean of micro-batch means is not the batch mean)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from heads.base import Head
from kotune.core.errors import KotuneError
from tasks.base import IGNORE


def labelled(labels: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """How many entries of ``labels`` carry a label (not -100); with class weights, the sum of their
    classes' weights (what a weighted cross-entropy's mean divides by)."""
    keep = labels != IGNORE
    if weight is None:
        return keep.sum()
    # every entry's weight, 0 where unlabelled: no boolean indexing, whose size the host must read
    return weight.to(labels.device)[torch.where(keep, labels, 0).long()].masked_fill(~keep, 0).sum()


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Summed cross-entropy over the labelled entries (``logits`` [..., classes], ``labels`` [...]),
    each scaled by its class's ``weight`` when given; 0 with a zero gradient where nothing is labelled."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten().long(), weight=weight,
                           ignore_index=IGNORE, reduction="sum")


def mean_of_terms(sums: list[torch.Tensor], counts) -> torch.Tensor:
    """Σ sum / count over the terms; ``counts`` [terms] (or [1, terms]: a DataParallel replica's
    share); a term with no items adds 0."""
    counts = torch.as_tensor(counts).reshape(-1, len(sums))[0]
    # a term with no items divides by 1 (its sum is 0); a weighted count may lie between 0 and 1
    return sum(s / counts[t].to(s.device, s.dtype).masked_fill(counts[t] == 0, 1) for t, s in enumerate(sums))


def _head_name(head: Head) -> str:
    """``the mean_regression head (my_plugin.heads.MeanRegressionHead)``: the head as a contract error names it."""
    cls = type(head)
    return f"the {getattr(head, 'registered_name', cls.__name__)} head ({cls.__module__}.{cls.__qualname__})"


def _shown(value) -> str:
    """What a head returned, in a few words: ``a Tensor of shape [8]``, ``float``."""
    if torch.is_tensor(value):
        return f"a Tensor of shape {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {', '.join(_shown(v) for v in value[:3])}{', ...' if len(value) > 3 else ''}"
    return type(value).__name__


def checked_sums(head: Head, sums) -> list[torch.Tensor]:
    """``head.loss_sums``' answer as the contract says (a list or tuple of one-element tensors, one sum per
    loss term), or one line naming the head: a plug-in head's mistake is found at its first batch, not
    as a traceback from inside the Trainer."""
    if (not isinstance(sums, (list, tuple)) or not sums
            or not all(torch.is_tensor(s) and s.numel() == 1 and s.is_floating_point() for s in sums)):
        raise KotuneError(f"{_head_name(head)}: loss_sums returned {_shown(sums)}; it must return a list of 0-d "
                          "float tensors, one sum per loss term (docs/development/plugins.md)")
    return list(sums)


def checked_counts(head: Head, counts, terms: int | None = None) -> torch.Tensor:
    """``head.loss_counts``' answer as the contract says (a 1-d tensor, one item count per loss term), or one line
    naming the head; ``terms``: how many sums ``loss_sums`` gave, where known."""
    if (not torch.is_tensor(counts) or counts.dim() != 1 or counts.numel() == 0
            or (terms is not None and counts.numel() != terms) or counts.is_complex() or counts.dtype == torch.bool):
        expected = f"{terms} entr{'y' if terms == 1 else 'ies'}" if terms is not None else "an entry per loss term"
        raise KotuneError(f"{_head_name(head)}: loss_counts returned {_shown(counts)}; it must return a 1-d tensor "
                          f"with {expected}, the number of labelled items in each loss term "
                          "(docs/development/plugins.md)")
    return counts


class CountedLoss(Head):
    """A head whose loss is ``mean_of_terms(loss_sums(logits, **labels), loss_counts(**labels))``;
    the labels are the batch fields ``label_fields`` names, in that order."""

    def loss_sums(self, logits, **labels) -> list[torch.Tensor]:
        raise NotImplementedError

    def loss_counts(self, **labels) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, logits, *labels: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """The batch's own mean (what evaluation reports; training divides by the step's counts)."""
        named.update(zip(self.label_fields, labels))
        sums = checked_sums(self, self.loss_sums(logits, **named))
        return mean_of_terms(sums, checked_counts(self, self.loss_counts(**named), len(sums)))


class LabelledCrossEntropy(CountedLoss):
    """Cross-entropy, the mean over the labelled entries: rows (a class per text), or tokens (a tag
    per slot; -100 on specials, padding, unlabelled subwords). A batch with none gives 0, not NaN."""

    def loss_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [cross_entropy_sum(logits, labels)]

    def loss_counts(self, labels: torch.Tensor) -> torch.Tensor:
        return labelled(labels).reshape(1)


class WeightedCrossEntropy(LabelledCrossEntropy):
    """``train.class_weights``: the cross-entropy's mean weighted by class, Σ w_y·loss / Σ w_y over
    the labelled entries (PyTorch's ``cross_entropy(weight=…)``; the counts are the weights' sum, so
    a step split into micro-batches still has the whole step's weighted mean). The weights are a head
    argument, saved in kotune.json with the others, so a reloaded checkpoint (eval, predict, a resumed
    run) computes the loss its training did; they are a buffer outside the state dict, so the
    exported native weights are unchanged. Without weights it is the plain mean."""

    def init_class_weights(self, weights: list[float] | None) -> None:
        tensor = None if weights is None else torch.tensor([float(w) for w in weights], dtype=torch.float)
        self.register_buffer("class_weights", tensor, persistent=False)

    def set_class_weights(self, weights: list[float]) -> None:
        self.class_weights = torch.tensor([float(w) for w in weights], dtype=torch.float,
                                          device=next(self.parameters()).device)

    def weighting(self) -> str | None:
        """Why this head cannot weight its classes, or None when it can."""
        return None

    def loss_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [cross_entropy_sum(logits, labels, self.class_weights)]

    def loss_counts(self, labels: torch.Tensor) -> torch.Tensor:
        return labelled(labels, self.class_weights).reshape(1)
