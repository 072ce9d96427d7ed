"""``model.padding_free``: the encoder reads a padded batch's real tokens only, packed into one row.

A right-padded batch [B, T] becomes one row [1, N] (N = the real tokens of all rows) whose position
ids restart at every row's first token (RoBERTa's at ``padding_idx + 1``, as its embeddings number
them); token types are packed alike. The encoder runs with no padding mask: transformers (5.25 and
later) reads the restarting position ids as packed sequences (``masking_utils.find_packed_sequence_indices``)
and gives attention a block-diagonal mask (flash attention's variable-length kernel where it is
installed). Every hidden state it returns (each layer's, for ``mode.layers``) is scattered back to
[B, T, H], zeros at the pads, so the heads read what they read from the padded batch.

Whether an encoder takes that path is checked, not assumed: :func:`check_padding_free` runs a small
encoder of the same class both ways once per class and attention implementation, and refuses in one
line when they differ (transformers before 5.25 lets packed rows attend to one another).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from kotune.core.errors import ConfigError

NEEDS_TRANSFORMERS = "5.25"  # the first release whose BERT, ELECTRA and RoBERTa pass position ids to their mask
PROBE_TOLERANCE = 1e-4       # fp32 on the small probe encoder: measured 2.4e-7 (sdpa) and 0 (eager) on 5.25
PROBE_LENGTHS = (3, 9, 1, 6)  # rows of different lengths, one of a single token
_checked: dict[tuple, str | None] = {}  # (encoder class, attention implementation) → why not, or None


@dataclass(frozen=True)
class Packed:
    """One padded batch as one packed row: the encoder's inputs [1, N] and where each token came from."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    real: torch.Tensor  # [B, T] bool: the real tokens of the padded batch


def base_encoder(encoder: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (``mode=lora``), else ``encoder`` itself."""
    return encoder.get_base_model() if hasattr(encoder, "get_base_model") else encoder


def first_position(encoder: nn.Module) -> int:
    """The position id of a row's first token: RoBERTa-style embeddings number real tokens from
    ``padding_idx + 1`` (they derive positions from the pads); BERT and ELECTRA from 0."""
    embeddings = getattr(base_encoder(encoder), "embeddings", None)
    if hasattr(embeddings, "create_position_ids_from_input_ids"):
        return int(embeddings.padding_idx) + 1
    return 0


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
         start: int = 0) -> Packed:
    """A right-padded batch as one row of its real tokens, position ids restarting at ``start`` per row."""
    real = attention_mask.bool()
    lengths = real.sum(1, keepdim=True)
    positions = torch.arange(real.size(1), device=real.device).expand_as(real)
    if not torch.equal(real, positions < lengths):  # a hole or left padding: positions would not match the padded path's
        raise ConfigError("model.padding_free: the batch is not right-padded (an attention mask with a hole or "
                          "left padding); set model.padding_free=false")
    return Packed(input_ids[real].unsqueeze(0), (positions[real] + start).unsqueeze(0),
                  None if token_type_ids is None else token_type_ids[real].unsqueeze(0), real)


def unpack(states: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[1, N, H] → [B, T, H]: each token's state where it stood in the padded batch, zeros at the pads."""
    out = states.new_zeros(*real.shape, states.size(-1))
    out[real] = states[0]
    return out


def packed_forward(encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False) -> BaseModelOutput:
    """``encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=...)`` on the packed
    batch: the same output fields, every state back in the padded batch's [B, T, H]."""
    packed = pack(input_ids, attention_mask, token_type_ids, first_position(encoder))
    kwargs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    if packed.token_type_ids is not None:
        kwargs["token_type_ids"] = packed.token_type_ids
    out = encoder(**kwargs, output_hidden_states=output_hidden_states)  # no mask: the positions mark the rows
    hidden = tuple(unpack(h, packed.real) for h in out.hidden_states) if output_hidden_states else None
    return BaseModelOutput(last_hidden_state=unpack(out.last_hidden_state, packed.real), hidden_states=hidden)


def padding_free_refusal(encoder: nn.Module) -> str | None:
    """Why ``encoder`` cannot read packed rows as it reads padded ones (one line), or None when it can."""
    base = base_encoder(encoder)
    attention = getattr(base.config, "_attn_implementation", None)
    key = (type(base), attention)
    if key not in _checked:
        _checked[key] = _probe(base, attention)
    return _checked[key]


def check_padding_free(encoder: nn.Module) -> None:
    why = padding_free_refusal(encoder)
    if why:
        raise ConfigError(why)


def _probe(base: nn.Module, attention: str | None) -> str | None:
    """A 1-layer encoder of ``base``'s class and attention implementation (sdpa for a GPU-only one:
    the probe runs on the CPU), on rows of different lengths, packed and padded: equal or refused."""
    import transformers

    family = base.config.model_type
    config = type(base.config).from_dict({
        **base.config.to_dict(), "num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
        "intermediate_size": 32, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        **({"embedding_size": 16} if hasattr(base.config, "embedding_size") else {})})
    config._attn_implementation = attention if attention in ("eager", "sdpa") else "sdpa"
    pad = int(config.pad_token_id or 0)
    config.vocab_size = max(pad + 2, 16)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random stream (init, data order) stays as it was
            torch.manual_seed(0)
            small = type(base)(config).eval()
            lengths = torch.tensor(PROBE_LENGTHS)
            mask = (torch.arange(int(lengths.max())) < lengths[:, None]).long()
            ids = torch.randint(0, config.vocab_size - 1, mask.shape)
            ids = torch.where(ids >= pad, ids + 1, ids).masked_fill(mask == 0, pad)  # no pad id among real tokens
        types = {"token_type_ids": mask * (torch.arange(mask.size(1)) >= 2)} if config.type_vocab_size > 1 else {}
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            padded = small(input_ids=ids, attention_mask=mask, **types).last_hidden_state
            packed = packed_forward(small, ids, mask, types.get("token_type_ids")).last_hidden_state
        gap = float((padded - packed)[mask.bool()].abs().max())
    except (TypeError, ValueError, RuntimeError, IndexError) as e:  # a model that takes no position ids, say
        gap, error = float("inf"), f" ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    else:
        error = ""
    if gap <= PROBE_TOLERANCE:
        return None
    if _older(transformers.__version__, NEEDS_TRANSFORMERS):
        return (f"model.padding_free needs transformers>={NEEDS_TRANSFORMERS}, whose {family} encoder tells packed rows "
                f"apart by their restarting position ids; in this transformers {transformers.__version__} they would "
                "attend to one another: upgrade, or set model.padding_free=false")
    return (f"model.padding_free: the {family} encoder ({type(base).__name__}, {config._attn_implementation} attention) "
            f"does not read packed rows as padded ones (hidden states differ by {gap:.2g}){error}; set "
            "model.padding_free=false")


def _older(version: str, than: str) -> bool:
    from packaging.version import Version

    return Version(version) < Version(than)
