"""Which encoder layers a head reads, and how a sequence is pooled.

``mode.layers`` picks the hidden states (index 0 = the embedding output, 1..L = the transformer
layers, negative = from the end):

- ``last``: the last layer (today's behaviour);
- ``last4_mean``: the mean of the last four layers;
- ``last4_concat``: the last four layers side by side (the head reads 4 × hidden per token);
- ``scalar_mix``: ELMo's learnable mix over *all* L+1 states, ``γ · Σ softmax(w)_j h_j``;
- ``[i, j, ...]``: the mean of those layers.

The split into :meth:`LayerMixer.states` (fixed: what the frozen cache stores) and
:meth:`LayerMixer.forward` (learned: only the scalar mix) is what lets a frozen run train on
cached features: for a fixed choice the stored stack holds one pre-averaged state per token, for
``last4_concat`` the four layers, for ``scalar_mix`` every layer (from which
:meth:`LayerSpec.select` derives any other choice: ``action=probe`` encodes once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from kotune.core.errors import ConfigError

LAYER_NAMES = ("last", "last4_mean", "last4_concat", "scalar_mix")
POOLINGS = ("cls", "mean")


@dataclass(frozen=True)
class LayerSpec:
    """A resolved ``mode.layers``: ``indices`` into the encoder's L+1 hidden states."""

    name: str                  # last | last4_mean | last4_concat | scalar_mix | list
    indices: tuple[int, ...]

    @property
    def learned(self) -> bool:
        return self.name == "scalar_mix"

    @property
    def concat(self) -> bool:
        return self.name == "last4_concat"

    @property
    def stored(self) -> int:
        """States per token that the fixed part produces (and the cache stores)."""
        return len(self.indices) if self.learned or self.concat else 1

    @property
    def width(self) -> int:
        """The head's input size in hidden sizes."""
        return len(self.indices) if self.concat else 1

    def select(self, hidden: Sequence[torch.Tensor] | Mapping[int, torch.Tensor]) -> torch.Tensor:
        """The fixed part from the hidden states (``hidden[i]``: [..., H], i = 0..L or the chosen i):
        [..., K, H] with K = :attr:`stored` (a mean of the chosen states when K = 1)."""
        chosen = torch.stack([hidden[i] for i in self.indices], dim=-2)
        return chosen if self.stored > 1 else chosen.mean(-2, keepdim=True)

    def describe(self) -> Any:
        return self.name if self.name != "list" else list(self.indices)


def parse_layers(value: Any, num_layers: int) -> LayerSpec:
    """``mode.layers`` against an encoder of ``num_layers`` transformer layers."""
    from omegaconf import ListConfig, OmegaConf

    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value)
    states = num_layers + 1  # the embedding output comes first
    if isinstance(value, str) and value.strip().startswith("["):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"mode.layers={value}: not a list of layer indices") from None
    if isinstance(value, str):
        if value == "last":
            return LayerSpec("last", (num_layers,))
        if value in ("last4_mean", "last4_concat"):
            if num_layers < 4:
                raise ConfigError(f"mode.layers={value} needs 4 layers; the encoder has {num_layers} "
                                  f"(use an index list such as mode.layers=[{max(1, num_layers - 1)},{num_layers}])")
            return LayerSpec(value, tuple(range(num_layers - 3, num_layers + 1)))
        if value == "scalar_mix":
            return LayerSpec("scalar_mix", tuple(range(states)))
        raise ConfigError(f"mode.layers={value}: unknown layer choice (choices: {', '.join(LAYER_NAMES)}, "
                          "or a list of indices such as [-4,-1])")
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0:
        indices = []
        for raw in value:
            if not isinstance(raw, int) or isinstance(raw, bool):
                raise ConfigError(f"mode.layers: index {raw!r} is not an integer")
            if not -states <= raw < states:
                raise ConfigError(f"mode.layers: index {raw} is out of range: the encoder has {states} "
                                  f"hidden states (0 = embeddings, 1..{num_layers} = layers, "
                                  f"-1 = last)")
            indices.append(raw % states)
        if len(set(indices)) != len(indices):
            raise ConfigError(f"mode.layers={list(value)}: an index is repeated")
        return LayerSpec("list", tuple(indices))
    raise ConfigError(f"mode.layers={value!r}: expected one of {', '.join(LAYER_NAMES)} or a list of indices")


def check_pooling(pooling: str | None) -> str | None:
    if pooling is not None and pooling not in POOLINGS:
        raise ConfigError(f"mode.pooling={pooling}: unknown pooling (choices: {', '.join(POOLINGS)})")
    return pooling


def pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor, how: str = "cls") -> torch.Tensor:
    """[B, T, H] → [B, H]: the first ([CLS]) state, or the mean over real (unmasked) tokens."""
    if how == "cls":
        return hidden_states[:, 0]
    mask = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
    return (hidden_states * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class ScalarMix(nn.Module):
    """ELMo (Peters et al. 2018): ``γ · Σ_j softmax(w)_j · h_j``; w starts uniform, γ at 1."""

    def __init__(self, num_states: int):
        super().__init__()
        self.scalar_weights = nn.Parameter(torch.zeros(num_states))
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        """``stack``: [B, T, K, H] → [B, T, H]."""
        weights = torch.softmax(self.scalar_weights, dim=0).to(stack.dtype)
        return self.gamma.to(stack.dtype) * torch.einsum("btkh,k->bth", stack, weights)

    def weights(self) -> list[float]:
        return [round(float(w), 6) for w in torch.softmax(self.scalar_weights.detach().float(), 0)]


class LayerMixer(nn.Module):
    """Encoder outputs → the hidden states a head reads, per :class:`LayerSpec`."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.spec = spec
        self.scalar_mix = ScalarMix(len(spec.indices)) if spec.learned else None

    def states(self, encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None, padding_free: bool = False) -> torch.Tensor:
        """The fixed part: [B, T, K, H] with K = :attr:`LayerSpec.stored`. ``padding_free``: the
        encoder reads the real tokens packed into one row (heads/model/packing.py), every state
        back in [B, T, H]."""
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if padding_free:
            from functools import partial

            from heads.model.packing import packed_forward

            encoder = partial(packed_forward, encoder)
        if self.spec.name == "last":
            return encoder(**kwargs).last_hidden_state.unsqueeze(2)
        return self.spec.select(encoder(**kwargs, output_hidden_states=True).hidden_states)

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        """The learned part: [B, T, K, H] → [B, T, H] (the mix, or the one state), or [B, T, K·H]
        (``last4_concat``: the K states side by side)."""
        if self.scalar_mix is not None:
            return self.scalar_mix(stack)
        return stack.flatten(-2)

    def report(self) -> dict:
        out: dict[str, Any] = {"layers": self.spec.describe(), "indices": list(self.spec.indices)}
        if self.scalar_mix is not None:
            out["scalar_mix"] = {"weights": self.scalar_mix.weights(),
                                 "gamma": round(float(self.scalar_mix.gamma.detach()), 6)}
        return out

    def describe_mix(self) -> str:
        """One line for the log: which layers the task leaned on."""
        if self.scalar_mix is None:
            return f"layers {self.spec.describe()}"
        weights = self.scalar_mix.weights()
        uniform = 1.0 / len(weights)
        top = max(range(len(weights)), key=weights.__getitem__)
        cells = " ".join(f"L{i}={w:.3f}" for i, w in zip(self.spec.indices, weights))
        return (f"scalar mix γ={float(self.scalar_mix.gamma.detach()):.3f}: {cells} "
                f"(uniform {uniform:.3f}; heaviest L{self.spec.indices[top]})")
