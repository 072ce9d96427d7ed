"""The vector side of ``action=embed`` (its text side is tasks/embed.py): pooled sentence vectors
and a word's per-layer vectors in context, computed with the frozen cache's batching."""
from __future__ import annotations

import numpy as np
import torch

from heads.model.feature_cache import iter_states
from heads.model.inference import Inference, resolve


def pooled_vectors(encoder: torch.nn.Module, mixer, features, pooling: str, *, batch_size: int,
                   inference: Inference | None = None, batch_tokens: int | None = None,
                   padding_free: bool = False) -> np.ndarray:
    """One vector per row: ``mode.layers`` through ``mixer``, then ``pooling`` (cls | mean), on
    ``inference``'s device and precision (None: the GPU where there is one, fp32), ``batch_size`` rows
    or ``batch_tokens`` tokens a batch; ``padding_free``: each batch's real tokens packed
    (heads/model/packing.py)."""
    from heads.model.layers import pool

    inference = inference or resolve()
    inference.place(encoder)
    inference.place(mixer)

    def vectors(ids, mask, token_types):
        return pool(mixer(mixer.states(encoder, ids, mask, token_types, padding_free)), mask, pooling)

    out = np.zeros((len(features), int(encoder.config.hidden_size) * mixer.spec.width), dtype=np.float32)
    pad_id = getattr(encoder.config, "pad_token_id", None) or 0
    for rows, batch in iter_states(vectors, features, pad_token_id=pad_id, batch_size=batch_size,
                                   inference=inference, what="embedding", batch_tokens=batch_tokens):
        out[rows] = batch
    return out


def token_vectors_by_layer(encoder: torch.nn.Module, features, picks: list[tuple[int, list[int]]], *,
                           batch_size: int, inference: Inference | None = None,
                           padding_free: bool = False) -> np.ndarray:
    """For each ``(row, token indices)`` pick, the mean of those tokens' states in every layer
    (embeddings first): [len(picks), L + 1, H]."""
    from heads.model.layers import LayerMixer, parse_layers

    inference = inference or resolve()
    inference.place(encoder)
    every_layer = LayerMixer(parse_layers("scalar_mix", int(encoder.config.num_hidden_layers)))
    rows = sorted({row for row, _ in picks})
    position = {row: k for k, row in enumerate(rows)}
    picks_of: dict[int, list[int]] = {}  # subset position → indices into picks
    for n, (row, _) in enumerate(picks):
        picks_of.setdefault(position[row], []).append(n)
    out = np.zeros((len(picks), every_layer.spec.stored, int(encoder.config.hidden_size)), dtype=np.float32)
    pad_id = getattr(encoder.config, "pad_token_id", None) or 0

    def all_layers(ids, mask, token_types):
        return every_layer.states(encoder, ids, mask, token_types, padding_free)

    for batch_rows, batch in iter_states(all_layers, features.select(rows), pad_token_id=pad_id,
                                         batch_size=batch_size, inference=inference,
                                         what="target word states"):
        for j, k in enumerate(batch_rows):  # reduce per batch: [T, L+1, H] per row adds up fast
            for n in picks_of[k]:
                out[n] = batch[j, picks[n][1]].mean(0)
    return out
