"""Relation head (KLUE RE, ``task.pooling=entity_start``): reads the states of the subject's and
the object's opening markers (token positions ``subject_start``, ``object_start`` from the task),
as Zhou & Chen (2021) and Baldini Soares et al. (2019, "entity start") do. ``task.pooling=cls``
uses the sequence head instead."""
from __future__ import annotations

import torch
from torch import nn

from heads.loss import LabelledCrossEntropy
from kotune.core.registry import register_head


@register_head("relation")
class RelationHead(LabelledCrossEntropy):
    """[subject-start state; object-start state] → dropout → dense → tanh → dropout → out."""

    extra_inputs = ("subject_start", "object_start")
    probabilities = "softmax"

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(2 * hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, subject_start: torch.Tensor,
                object_start: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(hidden_states.size(0), device=hidden_states.device)
        pair = torch.cat([hidden_states[rows, subject_start.long()], hidden_states[rows, object_start.long()]], -1)
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(pair)))))
