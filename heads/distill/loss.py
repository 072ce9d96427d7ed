"""Knowledge distillation's soft-target losses (``action=distill``), as sums over counted items like
every head's loss (heads/loss.py), so that a step split into micro-batches has the whole step's mean.

The teacher's logits arrive as the batch's ``teacher_logits`` column, [B, L, 1, C] as its cache
stores them (heads/distill/teacher_cache.py): one slot per row (L = 1) for the per-example heads, a
slot per labelled position for the token head, a start and an end logit (C = 2) per position for
the span head. Per head kind (``distill_kind``):

- ``classes`` (single-label sequence and pair heads, relation): T² · KL(p_t ‖ p_s) per row, with
  p = softmax(z / T) (Hinton et al.; DistilBERT's soft-target loss);
- ``sigmoid`` (multi-label): T² · the two-outcome KL of each label's sigmoid, per row and label;
- ``regression`` (STS): the squared error to the teacher's score, per row (no temperature);
- ``positions`` (token head): T² · KL per labelled position (labels -100 elsewhere are skipped);
- ``span`` (QA): T² · KL over the positions of the start and of the end, per row with an answer
  label, each half-weighted as the span head's own loss is.

For a student made of the teacher's layers, TinyBERT's intermediate losses: the hidden states
(``hidden_state_sum``) and the attention distributions (``attention_sum``) of each student layer
against the teacher layer it was copied from."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from heads.span import MASKED  # the span head's logit of a position that is not one
from tasks.base import IGNORE

KINDS = ("classes", "sigmoid", "regression", "positions", "span")


def distill_kind(head) -> str | None:
    """How ``head``'s logits are distilled; None: not at all (the dependency parser, plug-in heads)."""
    name = getattr(head, "registered_name", None)
    if name == "sequence":
        if getattr(head, "multi_label", False):
            return "sigmoid"
        return "regression" if int(head.num_labels) == 1 else "classes"
    return {"relation": "classes", "token": "positions", "span": "span"}.get(name)


def teacher_rows(kind: str, logits) -> torch.Tensor:
    """A teacher's batch logits as its cache stores them: [B, L, 1, C]."""
    if kind == "span":
        return torch.stack([logits[0], logits[1]], dim=-1).unsqueeze(2)
    if isinstance(logits, (tuple, list)):  # a CRF head in evaluation: (best paths, emissions)
        logits = logits[-1]
    if kind == "positions":
        return logits.unsqueeze(2)
    return logits.reshape(len(logits), 1, 1, -1)


def _kl_sum(teacher: torch.Tensor, student: torch.Tensor, temperature: float) -> torch.Tensor:
    """Σ over the last axis of KL(softmax(teacher / T) ‖ softmax(student / T)), per leading item."""
    log_t = F.log_softmax(teacher.float() / temperature, dim=-1)
    log_s = F.log_softmax(student.float() / temperature, dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def _binary_kl(teacher: torch.Tensor, student: torch.Tensor, temperature: float) -> torch.Tensor:
    t, s = teacher.float() / temperature, student.float() / temperature
    p = torch.sigmoid(t)
    return p * (F.logsigmoid(t) - F.logsigmoid(s)) + (1 - p) * (F.logsigmoid(-t) - F.logsigmoid(-s))


def soft_target_sum(kind: str, student, teacher: torch.Tensor, labels: dict, temperature: float) -> torch.Tensor:
    """The soft-target loss summed over the batch's items (``soft_target_count`` counts them)."""
    squared = temperature ** 2  # keeps the soft gradients' scale as T changes (Hinton et al.)
    if kind == "span":
        start, end = student[0], student[1]
        length = min(start.shape[1], teacher.shape[1])
        rows = labels["start_positions"].reshape(-1) != IGNORE
        total = start.new_zeros((), dtype=torch.float)
        for k, logits in enumerate((start, end)):
            real = logits[:, :length] > MASKED / 2
            target = teacher[:, :length, 0, k].to(logits.device).masked_fill(~real, MASKED)
            total = total + _kl_sum(target[rows], logits[:, :length][rows], temperature).sum() / 2
        return total * squared
    if isinstance(student, (tuple, list)):
        student = student[-1]
    teacher = teacher.to(student.device)
    if kind == "positions":
        mask = labels["labels"] != IGNORE
        length = min(student.shape[1], teacher.shape[1], mask.shape[1])
        kl = _kl_sum(teacher[:, :length, 0], student[:, :length], temperature)
        return (kl * mask[:, :length]).sum() * squared
    first = teacher[:, 0, 0, : student.shape[-1]]
    if kind == "regression":
        return ((student.reshape(-1).float() - first.reshape(-1).float()) ** 2).sum()
    if kind == "sigmoid":
        return _binary_kl(first, student, temperature).sum() * squared
    return _kl_sum(first, student, temperature).sum() * squared


def soft_target_count(kind: str, labels: dict, teacher: torch.Tensor) -> torch.Tensor:
    """The items the soft-target loss is a mean over: rows (every row a teacher labelled, with a
    label or not), rows × labels (sigmoid), labelled positions, or rows with an answer label (span)."""
    rows = torch.full((), len(teacher), device=teacher.device)  # filled there: no copy from the host
    if kind == "positions":
        return (labels["labels"] != IGNORE).sum().to(teacher.device)
    if kind == "span":
        return (labels["start_positions"] != IGNORE).sum().to(teacher.device)
    if kind == "sigmoid":
        return rows * teacher.shape[-1]
    return rows


def hidden_state_sum(student_states: list[torch.Tensor], teacher_states: list[torch.Tensor],
                     attention_mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT's intermediate loss: Σ over the mapped layer pairs of the squared error between
    the student's and the teacher's hidden states, averaged over the width, summed over the real
    tokens (a mean over real tokens once divided by their count and the layers)."""
    mask = attention_mask.unsqueeze(-1).float()
    total = attention_mask.new_zeros((), dtype=torch.float)
    for s, t in zip(student_states, teacher_states):
        total = total + (((s.float() - t.float()) ** 2).mean(-1, keepdim=True) * mask).sum()
    return total


def attention_sum(student_maps: list[torch.Tensor], teacher_maps: list[torch.Tensor],
                  attention_mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT's attention loss on the attention distributions ([B, heads, query, key]): Σ over
    the mapped layer pairs of the squared error of each real query's row, summed over the keys and
    averaged over the heads, summed over the real query tokens (a mean over real tokens once
    divided by their count and the layers, as ``hidden_state_sum``). Padded keys weigh 0 in both."""
    queries = attention_mask.float()[:, None, :, None]
    total = attention_mask.new_zeros((), dtype=torch.float)
    for s, t in zip(student_maps, teacher_maps):
        total = total + (((s.float() - t.float()) ** 2) * queries).sum(-1).mean(1).sum()
    return total
