"""A head of the plug-in's own: the mean of the real tokens' states → a linear layer (no [CLS], no pooler)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import kotune


@kotune.register_head("mean_linear")
class MeanLinearHead(kotune.Head):
    """Masked mean of the token states → dropout → linear → class logits."""

    label_fields = ("labels",)
    pipeline_tag = "text-classification"
    probabilities = "softmax"  # its logits are a softmax over the classes: train.calibrate applies

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(hidden_states.dtype)
        mean = (hidden_states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.out(self.dropout(mean))

    def loss_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [F.cross_entropy(logits.float(), labels.long(), ignore_index=-100, reduction="sum")]

    def loss_counts(self, labels: torch.Tensor) -> torch.Tensor:
        return (labels != -100).sum().reshape(1)
