"""Losses as sums over counted items, so that one effective batch split into micro-batches
(``train.grad_accum``, data-parallel processes) has exactly the loss and gradients of the whole
batch at once: the mean over *its* labelled items (rows, labelled tokens, masked tokens, pairs).

A head's loss is one or more terms, each a mean over its own items (span heads: the start and the
end position; the dependency head: the arc and the label; BERT pretraining: the masked tokens
and the sentence pairs). A head gives each term's *sum* over a batch (``loss_sums``) and, from the
labels alone, its item count (``loss_counts``). Trainer counts all micro-batches of an optimizer
step before the first forward (kotune/trainer.py): the step's loss is then Σ sum / count, with
the counts of the whole step, and no micro-batch's mean is weighted as much as another's whatever
its number of items (the mean of micro-batch means is not the batch mean)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tasks.collate import IGNORE


def labelled(labels: torch.Tensor) -> torch.Tensor:
    """How many entries of ``labels`` carry a label (not -100)."""
    return (labels != IGNORE).sum()


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the labelled entries (``logits`` [..., classes], ``labels`` [...]);
    0 with a zero gradient where nothing is labelled."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten().long(), ignore_index=IGNORE,
                           reduction="sum")


def mean_of_terms(sums: list[torch.Tensor], counts) -> torch.Tensor:
    """Σ sum / count over the terms; ``counts`` [terms] (or [1, terms]: a DataParallel replica's
    share); a term with no items adds 0."""
    counts = torch.as_tensor(counts).reshape(-1, len(sums))[0]
    return sum(s / counts[t].to(s.device, s.dtype).clamp(min=1) for t, s in enumerate(sums))


class CountedLoss(nn.Module):
    """A head whose loss is ``mean_of_terms(loss_sums(logits, **labels), loss_counts(**labels))``;
    the labels are the batch fields ``label_fields`` names, in that order."""

    label_fields: tuple[str, ...] = ()

    def loss_sums(self, logits, **labels) -> list[torch.Tensor]:
        raise NotImplementedError

    def loss_counts(self, **labels) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, logits, *labels: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """The batch's own mean (what evaluation reports; training divides by the step's counts)."""
        named.update(zip(self.label_fields, labels))
        return mean_of_terms(self.loss_sums(logits, **named), self.loss_counts(**named))


class LabelledCrossEntropy(CountedLoss):
    """Cross-entropy, the mean over the labelled entries: rows (a class per text), or tokens (a tag
    per slot; -100 on specials, padding, unlabelled subwords). A batch with none gives 0, not NaN."""

    def loss_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [cross_entropy_sum(logits, labels)]

    def loss_counts(self, labels: torch.Tensor) -> torch.Tensor:
        return labelled(labels).reshape(1)
