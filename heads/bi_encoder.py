"""The bi-encoder's head: no layer of its own, the pooling that turns the token states ``mode.layers``
picked into one sentence vector (``cls`` | ``mean`` of real tokens). It trains through
sentence-transformers' losses on the SentenceTransformer built on the same encoder
(heads/model/sentence_transformer.py), never through a loss of its own."""
from __future__ import annotations

import torch

from heads.base import Head
from heads.model.layers import pool
from heads.model.sentence_transformer import DEFAULT_POOLING, embedding_spec
from kotune.core.errors import ConfigError
from kotune.core.registry import register_head


@register_head("bi_encoder")
class BiEncoderHead(Head):
    """[B, T, H] token states → [B, H] sentence embeddings."""

    label_fields = ()
    pipeline_tag = "sentence-similarity"
    native_dropout = 0.0  # nothing to drop: the vector is the pooled states

    def __init__(self, hidden_size: int, pooling: str = DEFAULT_POOLING, dropout: float | None = None):
        super().__init__()
        _, self.pooling = embedding_spec("last", pooling, 1)
        self.hidden_size = hidden_size

    @property
    def onnx_outputs(self) -> tuple[str, ...]:
        return ("sentence_embedding",)

    def options(self) -> dict:
        return {}

    def native_export(self) -> str:
        return "a sentence embedding: export.format=sentence_transformers (or onnx) writes it"

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return pool(hidden_states, attention_mask, self.pooling)

    def loss_sums(self, logits, **labels):
        raise ConfigError("the bi_encoder head trains through sentence-transformers' losses (task=sentence_embedding)")

    def loss_counts(self, **labels):
        raise ConfigError("the bi_encoder head trains through sentence-transformers' losses (task=sentence_embedding)")
