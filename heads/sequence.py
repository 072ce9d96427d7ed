"""[CLS] heads for single texts and sentence pairs (classification, or regression when
``num_labels == 1``)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heads.layers import check_pooling, pool
from tasks.base import LABEL_FIELDS


class SequenceHead(nn.Module):
    """[CLS] state → dense → tanh → dropout → out, as BERT's pooler-plus-classifier does.
    ``pooling="mean"`` (``mode.pooling``) reads the masked mean of the real tokens instead."""

    label_fields = LABEL_FIELDS["sequence"]

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, pooling: str = "cls"):
        super().__init__()
        self.num_labels = num_labels
        self.pooling = check_pooling(pooling) or "cls"
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)

    def pool(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return pool(hidden_states, attention_mask, self.pooling)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.dropout(torch.tanh(self.dense(self.dropout(self.pool(hidden_states, attention_mask)))))
        return self.out(x)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.num_labels == 1:
            return F.mse_loss(logits.squeeze(-1).float(), labels.float())
        return F.cross_entropy(logits.float(), labels.long())
