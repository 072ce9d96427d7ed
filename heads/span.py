"""The span head for extractive QA: where does the answer start and end?

Per token (``units="token"``): a start and an end logit per token (BERT's QA head). Answer edges
are token edges.

Per character (``units="char"``, ``task.decode=char``): answer edges are *characters*. A WordPiece vocabulary glues particles to nouns
(``임수`` ``##경은``): no token span spells ``임수경``. Each candidate edge character scores

    token logit of its token  +  offset logit of (its token's state, its position in the token)

where the start offset counts from the token's first character and the end offset from the
token's last one (a particle cut off the end is "1 from the end" whatever the token's length).
The offset logits are a K-way classifier on the token state (K = ``max_token_chars``), gathered
at each character's position; characters further than K-1 inside one token share the last class.
The task sends, for each character slot of a window, its token (``char_token_index``) and its rank
inside that token (``char_in_token``), never the characters themselves; slot 0 is [CLS] (the null
answer), padding is -100.
"""
from __future__ import annotations

import torch
from torch import nn

from heads.base import NativeHead
from heads.loss import CountedLoss, cross_entropy_sum, labelled
from heads.native import init_new_layers
from kotune.core.errors import ConfigError
from kotune.core.registry import register_head

MASKED = -1.0e4  # a logit no real position reaches; finite, so fp16/bf16 stay finite
CHAR_INPUTS = ("char_token_index", "char_in_token")


class SpanLoss(CountedLoss):
    """Mean of the start and the end cross-entropy (``*ForQuestionAnswering``'s), each over the
    windows with a target; windows whose gold answer was rejected on load carry -100 and teach
    nothing (a batch of only those gives 0, not NaN)."""

    def loss_sums(self, logits, start_positions: torch.Tensor, end_positions: torch.Tensor) -> list[torch.Tensor]:
        return [cross_entropy_sum(logits[0], start_positions) / 2, cross_entropy_sum(logits[1], end_positions) / 2]

    def loss_counts(self, start_positions: torch.Tensor, end_positions: torch.Tensor) -> torch.Tensor:
        return torch.stack([labelled(start_positions), labelled(end_positions)])


@register_head("span")
class SpanHead(SpanLoss):
    """Per token: token states → (start logits, end logits) over the window's tokens, the
    ``qa_outputs`` of ``*ForQuestionAnswering`` (which has no dropout: ``dropout`` is 0 unless
    train.head_dropout sets it). Padding gets a logit no real token reaches.

    Per character (``units="char"``): token states + each character's place in its token → (start,
    end) logits over the window's character slots (slot 0 = [CLS])."""

    label_fields = ("start_positions", "end_positions")
    pipeline_tag = "question-answering"
    native_dropout = 0.0  # QA output layers have no dropout in any of the three architectures
    aliases = {"span_char": {"units": "char"}}  # the kind of kotune < 0.2
    # transformers 5 removed the question-answering pipeline: AutoModelForQuestionAnswering serves it
    native = NativeHead("ForQuestionAnswering", {"*": {"out": "qa_outputs"}}, pipeline=None)

    def __init__(self, hidden_size: int, dropout: float = 0.0, init_std: float = 0.02, units: str = "token",
                 max_token_chars: int = 32):
        super().__init__()
        if units not in ("token", "char"):
            raise ConfigError(f"span head units must be token or char, got '{units}'")
        self.units = units
        self.dropout = nn.Dropout(dropout)
        if units == "char":
            self.max_token_chars = int(max_token_chars)
            self.token = nn.Linear(hidden_size, 2)
            self.offset = nn.Linear(hidden_size, 2 * self.max_token_chars)
            init_new_layers(self, init_std)
            # starts as plain token decoding: every character of a token gets its token's score
            nn.init.zeros_(self.offset.weight)
            nn.init.zeros_(self.offset.bias)
        else:
            self.out = nn.Linear(hidden_size, 2)
            init_new_layers(self, init_std)

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        return CHAR_INPUTS if self.units == "char" else ()

    @property
    def onnx_outputs(self) -> tuple[str, ...]:
        return ("start_logits", "end_logits")

    def options(self) -> dict:
        return {"units": "char"} if self.units == "char" else {}

    def native_export(self) -> NativeHead | str:
        if self.units == "char":
            return ("its answer edges are characters inside tokens (task.decode=char); a QA model's edges are "
                    "tokens")
        return self.native

    def native_config(self, config, kwargs: dict) -> None:
        config.num_labels = 2  # a start and an end logit

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                char_token_index: torch.Tensor | None = None, char_in_token: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.units == "char":
            return self.char_forward(hidden_states, char_token_index, char_in_token)
        logits = self.out(self.dropout(hidden_states)).masked_fill(attention_mask.unsqueeze(-1) == 0, MASKED)
        start, end = logits.unbind(-1)
        return start.contiguous(), end.contiguous()

    def char_forward(self, hidden_states: torch.Tensor, char_token_index: torch.Tensor,
                     char_in_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = hidden_states.shape
        k = self.max_token_chars
        h = self.dropout(hidden_states)
        token_logits = self.token(h)  # b, t, 2
        offset_logits = self.offset(h).view(b, t, 2, k)
        valid = char_token_index >= 0
        index = char_token_index.long().clamp(min=0)
        rank = char_in_token.long().clamp(min=0)
        # characters per token, counted from the slots themselves (the task's definition of rank)
        chars_in_token = torch.zeros(b, t, dtype=torch.long, device=index.device)
        chars_in_token.scatter_add_(1, index, valid.long())
        from_end = chars_in_token.gather(1, index) - 1 - rank
        start_class = rank.clamp(max=k - 1)
        end_class = from_end.clamp(min=0, max=k - 1)
        per_slot_token = token_logits.gather(1, index.unsqueeze(-1).expand(-1, -1, 2))  # b, c, 2
        per_slot_offsets = offset_logits.gather(1, index[..., None, None].expand(-1, -1, 2, k))  # b, c, 2, k
        start = per_slot_token[..., 0] + per_slot_offsets[:, :, 0].gather(-1, start_class.unsqueeze(-1)).squeeze(-1)
        end = per_slot_token[..., 1] + per_slot_offsets[:, :, 1].gather(-1, end_class.unsqueeze(-1)).squeeze(-1)
        return start.masked_fill(~valid, MASKED), end.masked_fill(~valid, MASKED)
