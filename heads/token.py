"""Token tagging heads: a tag per subword (``token``), or a tag per character (``token_char``).

``token_char`` lets every character inside a subword carry its own tag, so an entity boundary
inside a token (``경찰은`` → 경찰 + 은) stays expressible: a character is represented by the state of
the token that covers it plus embeddings of its position counted from the token's start and from
its end (particles sit at the end), mixed by a small feed-forward layer. Which token and which
position each character has comes from the task's alignment (extra inputs ``char_token_index``,
``char_pos_start``, ``char_pos_end``; padded with -100 by the collator).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heads.loss import WeightedCrossEntropy
from heads.native import init_new_layers
from tasks.base import LABEL_FIELDS


class TokenHead(WeightedCrossEntropy):
    """Each token state → dropout → linear → tag logits, shape (batch, tokens, labels): the
    ``classifier`` of ``*ForTokenClassification``."""

    label_fields = LABEL_FIELDS["token"]

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, init_std: float = 0.02,
                 class_weights: list[float] | None = None):
        super().__init__()
        self.init_class_weights(class_weights)  # train.class_weights (heads/loss.py)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)
        init_new_layers(self, init_std)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(hidden_states))


class CharTokenHead(WeightedCrossEntropy):
    """A tag per character, as a correction of the covering token's tag: logits =
    linear(token state) + linear₀(GELU(dense(LN(token state + position embeddings)))), with linear₀
    zero-initialised, so training starts from the subword head's answer (every character of a
    token gets its tag) and learns where characters differ (B- → I- after the first, a particle
    at the end back to O). Logits shape (batch, characters, labels)."""

    label_fields = LABEL_FIELDS["token_char"]

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, max_char_positions: int = 16,
                 init_std: float = 0.02, class_weights: list[float] | None = None):
        super().__init__()
        self.init_class_weights(class_weights)
        self.max_char_positions = max_char_positions
        # positions past the last embedding share it (only very long [UNK] tokens get there)
        self.from_start = nn.Embedding(max_char_positions, hidden_size)
        self.from_end = nn.Embedding(max_char_positions, hidden_size)
        self.norm = nn.LayerNorm(hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)
        self.correction = nn.Linear(hidden_size, num_labels)
        # the token classifier as *ForTokenClassification inits it; the character machinery
        # (position embeddings at N(0, 1), so positions register through the LayerNorm) keeps
        # PyTorch's defaults: with 0.02-std embeddings a small budget never learned a boundary
        init_new_layers(self.out, init_std)
        nn.init.zeros_(self.correction.weight)
        nn.init.zeros_(self.correction.bias)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, char_token_index: torch.Tensor,
                char_pos_start: torch.Tensor, char_pos_end: torch.Tensor) -> torch.Tensor:
        index = char_token_index.long().clamp(min=0)  # padded slots (-100) read token 0; never scored
        states = torch.gather(hidden_states, 1, index.unsqueeze(-1).expand(-1, -1, hidden_states.size(-1)))
        last = self.max_char_positions - 1
        states = self.dropout(states)
        x = states + self.from_start(char_pos_start.long().clamp(0, last)) \
            + self.from_end(char_pos_end.long().clamp(0, last))
        return self.out(states) + self.correction(self.dropout(F.gelu(self.dense(self.norm(x)))))
