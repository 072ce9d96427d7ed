"""kotune's encoder as a ``sentence_transformers.SentenceTransformer`` made of the library's stock
modules, so that its losses, evaluators, trainer and save format apply unchanged and a saved model
loads with ``SentenceTransformer(path)`` alone (no kotune, no remote code):

- ``Transformer``: its ``model`` *is* the kotune encoder (shared, not copied: training the
  SentenceTransformer trains the encoder a KotuneModel saves);
- ``WeightedLayerPooling`` (only when ``mode.layers`` is not ``last``): fixed 0/1 weights over
  the hidden states from the first chosen one, i.e. the mean of the chosen layers, kotune's
  ``LayerSpec.select`` (heads/model/layers.py); the encoder's config gets
  ``output_hidden_states=true``, which the library reads to pass every layer on;
- ``Pooling``: ``cls`` or ``mean`` over real tokens, kotune's ``pool``.

So ``mode.layers=last4_mean mode.pooling=mean`` is "last-4 mean", ``mode.layers=6`` is layer 6, as
frozen mode and ``action=embed`` name them. ``scalar_mix`` (learned γ·softmax weights) and
``last4_concat`` (4·H wide) have no stock module with the same computation and are refused.
"""
from __future__ import annotations

import logging
import tempfile
from typing import Any

import torch

from heads.model.layers import LayerSpec, check_pooling, parse_layers
from kotune.core.errors import ConfigError

DEFAULT_POOLING = "mean"  # SBERT's; [CLS] is kotune's classifier default, mean is the bi-encoder's


def embedding_spec(layers: Any, pooling: str | None, num_layers: int) -> tuple[LayerSpec, str]:
    """``mode.layers`` and ``mode.pooling`` of a bi-encoder, checked: the layer choice and token pooling."""
    spec = parse_layers(layers, num_layers)
    if spec.learned or spec.concat:
        raise ConfigError(f"mode.layers={spec.name}: a sentence embedding reads one state per token "
                          "(last, last4_mean, a layer index or a list of them, averaged); "
                          f"{spec.name} has no sentence-transformers module with the same computation")
    return spec, check_pooling(pooling) or DEFAULT_POOLING


def build_sentence_transformer(encoder: torch.nn.Module, tokenizer, *, layers: Any = "last",
                               pooling: str | None = DEFAULT_POOLING, max_length: int = 128,
                               device: str | None = None):
    """A SentenceTransformer on ``encoder`` (a transformers ``AutoModel``, e.g. ``KotuneModel.encoder``
    or ``heads.model.encoder.load_encoder(cfg.model, ...)``) and its ``tokenizer``, pooling as
    ``layers`` (``mode.layers``: last | last4_mean | index | [indices]) and ``pooling`` (cls | mean)
    say. The encoder is shared, not copied."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, WeightedLayerPooling
    from sentence_transformers.base.modules.transformer import Transformer

    num_layers = int(encoder.config.num_hidden_layers)
    spec, pooling = embedding_spec(layers, pooling, num_layers)
    hidden = int(encoder.config.hidden_size)
    # the library builds its Transformer module from a directory: the config and tokenizer go through
    # one, the weights it loads there are replaced by the encoder itself
    with tempfile.TemporaryDirectory() as staging, _quiet_transformers():
        encoder.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        transformer = Transformer(staging, max_seq_length=int(max_length))
    transformer.model = encoder
    modules: list[torch.nn.Module] = [transformer]
    if spec.name != "last":
        encoder.config.output_hidden_states = True
        start = min(spec.indices)
        weights = torch.tensor([1.0 if i in spec.indices else 0.0 for i in range(start, num_layers + 1)])
        modules.append(WeightedLayerPooling(hidden, num_hidden_layers=num_layers, layer_start=start,
                                            layer_weights=torch.nn.Parameter(weights, requires_grad=False)))
    modules.append(Pooling(hidden, pooling_mode=pooling))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return SentenceTransformer(modules=modules, device=device)


def from_kotune_model(model, tokenizer, device: str | None = None):
    """The SentenceTransformer of a bi-encoder KotuneModel (head ``bi_encoder``): its encoder, layer
    choice and pooling, at the length it was trained with."""
    return build_sentence_transformer(model.encoder, tokenizer, layers=model.mixer.spec.describe(),
                                      pooling=model.head.pooling,
                                      max_length=int(model.meta.get("max_length") or 128), device=device)


class _quiet_transformers:
    """transformers' load notes (an encoder saved without its pooler) while the staging copy loads."""

    def __enter__(self):
        self.logger = logging.getLogger("transformers")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
