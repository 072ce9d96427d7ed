"""Students for ``action=distill``: the teacher's encoder with K of its layers kept (DistilBERT's
initialisation), or a narrower encoder of the teacher's architecture and vocabulary with random
weights. Both are plain transformers encoders: a student saves, exports and serves as any model."""
from __future__ import annotations

import copy
from typing import Any

import torch

from kotune.core.errors import ConfigError

LAYER_CHOICES = ("spread", "first", "last")


def layer_stack(encoder: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The encoder's list of transformer layers (BERT, RoBERTa, ELECTRA: ``encoder.layer``), or None."""
    stack = getattr(getattr(encoder, "encoder", None), "layer", None)
    return stack if isinstance(stack, torch.nn.ModuleList) else None


def choose_layers(choice: Any, depth: int, keep: int) -> list[int]:
    """The teacher layers (0-based) a K-layer student copies: ``spread`` spaces them evenly from the
    first to the last (12 → 6: 0 2 4 7 9 11, as DistilBERT's extraction script), ``first`` and
    ``last`` the bottom or top K, or a list of layer numbers."""
    if keep < 1 or keep > depth:
        raise ConfigError(f"distill.student_layers={keep}: the teacher has {depth} layer(s); keep 1 to {depth}")
    if isinstance(choice, (list, tuple)):
        chosen = [int(i) for i in choice]
        if len(chosen) != keep or len(set(chosen)) != keep or not all(0 <= i < depth for i in chosen):
            raise ConfigError(f"distill.layers={chosen}: give {keep} different layer numbers from 0 to {depth - 1}")
        return sorted(chosen)
    if choice == "first":
        return list(range(keep))
    if choice == "last":
        return list(range(depth - keep, depth))
    if choice == "spread":
        return [0] if keep == 1 else [round(i * (depth - 1) / (keep - 1)) for i in range(keep)]
    raise ConfigError(f"distill.layers={choice}: choose one of {', '.join(LAYER_CHOICES)} or a list of layer numbers")


def copy_layers(encoder: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """A copy of ``encoder`` (embeddings and all) with only ``layers`` of its stack, in order."""
    stack = layer_stack(encoder)
    if stack is None:
        raise ConfigError(f"distill.student_layers: the teacher's encoder ({type(encoder).__name__}) has no "
                          "encoder.layer stack to copy layers from; give the student as model= or distill.student_hidden=")
    student = copy.deepcopy(encoder)
    student.encoder.layer = torch.nn.ModuleList([student.encoder.layer[i] for i in layers])
    for new_index, layer in enumerate(student.encoder.layer):
        for module in layer.modules():  # attention caches are indexed by layer (unused by an encoder)
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    student.config.num_hidden_layers = len(layers)
    return student


def narrow_encoder(teacher_config, hidden: int, layers: int, seed: int) -> torch.nn.Module:
    """A random encoder of the teacher's architecture and vocabulary, ``hidden`` wide and ``layers``
    deep: the teacher's attention-head width kept (fewer heads), its feed-forward ratio kept."""
    from transformers import AutoModel

    from heads.model.encoder import no_pooler

    config = copy.deepcopy(teacher_config)
    head_width = config.hidden_size // config.num_attention_heads
    if hidden < 1 or hidden % head_width:
        raise ConfigError(f"distill.student_hidden={hidden}: a multiple of the teacher's attention-head width "
                          f"({head_width}) is needed")
    ratio = config.intermediate_size / config.hidden_size
    config.hidden_size, config.num_attention_heads = hidden, hidden // head_width
    config.intermediate_size, config.num_hidden_layers = int(round(hidden * ratio)), layers
    if hasattr(config, "embedding_size"):  # ELECTRA: embeddings as wide as the layers
        config.embedding_size = hidden
    torch.manual_seed(seed)
    return AutoModel.from_config(config, **no_pooler(config))
