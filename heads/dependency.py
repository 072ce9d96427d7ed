"""Dependency head (KLUE DP): a biaffine arc scorer and a biaffine label classifier over word
states (Dozat & Manning 2017, "Deep Biaffine Attention for Neural Dependency Parsing").

A word's state is its first subword's or the mean of its subwords' (``word_pooling``); which
token belongs to which word comes from the task (``token_word``: a 0-based word number per token,
-100 for specials and padding). The [CLS] state stands for the root, candidate head 0; word k is
candidate k+1. Words with no token (lost to truncation, or without a subword) are neither
dependents nor candidate heads.

* training: arc scores for every (dependent, candidate) pair and label scores for every pair;
  the loss is the cross-entropy of the gold head plus that of the gold label *at the gold head*.
* inference (``eval()``): per word the best-scoring head and the label *at that predicted head*,
  as two [batch, words] tensors (Trainer can gather those across batches of different widths; the
  pairwise scores it could not). The evaluation loss is then the labelled-attachment error rate
  (a 0-1 loss): the cross-entropy needs the pairwise scores.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heads.token import tagging_loss
from tasks.base import LABEL_FIELDS
from tasks.collate import IGNORE


class DependencyHead(nn.Module):
    label_fields = LABEL_FIELDS["dependency"]

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, word_pooling: str = "first",
                 arc_dim: int = 512, label_dim: int = 128):
        super().__init__()
        self.word_pooling = word_pooling
        self.dropout = nn.Dropout(dropout)
        self.arc_dep, self.arc_head = nn.Linear(hidden_size, arc_dim), nn.Linear(hidden_size, arc_dim)
        self.label_dep, self.label_head = nn.Linear(hidden_size, label_dim), nn.Linear(hidden_size, label_dim)
        # biaffine weights start at zero (as Dozat & Manning): every head equally likely at first
        self.arc_weight = nn.Parameter(torch.zeros(arc_dim, arc_dim))
        self.arc_head_bias = nn.Parameter(torch.zeros(arc_dim))
        self.label_weight = nn.Parameter(torch.zeros(num_labels, label_dim + 1, label_dim + 1))

    def word_states(self, hidden_states: torch.Tensor, token_word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, H] → root + word states [B, 1 + W, H] and which of those exist [B, 1 + W]."""
        token_word = token_word.long()
        width = int(token_word.max().clamp(min=-1)) + 1
        words = torch.arange(width, device=token_word.device)
        member = (token_word.unsqueeze(1) == words.view(1, -1, 1)).to(hidden_states.dtype)  # [B, W, T]
        if self.word_pooling == "first":
            member = member * (member.cumsum(-1) == 1).to(member.dtype)
        counts = member.sum(-1, keepdim=True)
        states = member @ hidden_states / counts.clamp(min=1.0)
        nodes = torch.cat([hidden_states[:, :1], states], 1)
        exists = torch.cat([torch.ones_like(counts[:, :1, 0], dtype=torch.bool), counts[..., 0] > 0], 1)
        return nodes, exists

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                token_word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nodes, exists = self.word_states(hidden_states, token_word)
        nodes = self.dropout(nodes)
        dep = self.dropout(F.elu(self.arc_dep(nodes[:, 1:])))
        head = self.dropout(F.elu(self.arc_head(nodes)))
        arc = dep @ self.arc_weight @ head.transpose(1, 2) + (head @ self.arc_head_bias).unsqueeze(1)  # [B, W, 1 + W]
        width = arc.size(1)
        # a candidate must exist and differ from the dependent (word k is candidate k + 1)
        self_arc = torch.cat([torch.zeros(width, 1), torch.eye(width)], 1).bool().to(arc.device)
        allowed = exists.unsqueeze(1) & ~self_arc
        arc = arc.float().masked_fill(~allowed, torch.finfo(torch.float32).min / 2)
        label_dep = self._with_bias(F.elu(self.label_dep(nodes[:, 1:])))
        label_head = self._with_bias(F.elu(self.label_head(nodes)))
        if self.training:  # every pair: the loss picks the gold head
            labels = torch.einsum("bix,lxy,bjy->bijl", label_dep, self.label_weight, label_head)
            return arc, labels
        heads = arc.argmax(-1)  # [B, W]
        at_head = torch.gather(label_head, 1, heads.unsqueeze(-1).expand(-1, -1, label_head.size(-1)))
        labels = torch.einsum("bix,lxy,biy->bil", label_dep, self.label_weight, at_head).argmax(-1)
        return heads, labels

    def _with_bias(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.dropout(x), torch.ones_like(x[..., :1])], -1)

    def loss(self, logits: tuple[torch.Tensor, torch.Tensor], heads: torch.Tensor, deprels: torch.Tensor) -> torch.Tensor:
        first = logits[0]
        heads, deprels = (self._fit(t.long(), first.size(1)) for t in (heads, deprels))
        if first.dim() == 2:  # inference outputs: the labelled-attachment error rate
            scored = heads != IGNORE
            wrong = (first != heads) | (logits[1] != deprels)
            return (wrong & scored).sum().float() / scored.sum().clamp(min=1).float()
        arc, labels = logits
        at_gold = torch.gather(labels, 2, heads.clamp(min=0)[..., None, None].expand(-1, -1, 1, labels.size(-1)))
        return tagging_loss(arc, heads) + tagging_loss(at_gold.squeeze(2), deprels)

    @staticmethod
    def _fit(labels: torch.Tensor, width: int) -> torch.Tensor:
        """Label rows padded by the collator (maybe rounded up) to the batch's word count."""
        if labels.size(1) >= width:
            return labels[:, :width]
        return F.pad(labels, (0, width - labels.size(1)), value=IGNORE)
