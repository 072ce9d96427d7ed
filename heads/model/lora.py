"""LoRA on the shared encoder through the peft library (``mode=lora``): the adapter's settings
and its defaults per architecture, putting it on an encoder, the record of the base encoder an
adapter was trained on (so that a checkpoint holds the adapter and head only), and merging it
into the base for export.

Only the encoder is handed to peft. kotune's head (and the scalar mix) are separate modules of
``KotuneModel`` that train and save as in the other modes, so peft's ``modules_to_save`` trap (a
task head inside a ``PeftModel`` that is frozen and left out of the adapter unless it is listed)
cannot happen. Rows a task adds to the vocabulary (KLUE RE's ``<subj>`` markers) are peft
``trainable_token_indices``: they train and are saved with the adapter as their values, not as
differences from a random row that a reload could not reproduce.
"""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from kotune.core.errors import ConfigError, KotuneError

ADAPTER_DIR = "adapter"  # <model dir>/adapter: peft's save_pretrained (adapter_config.json, adapter_model.safetensors)
SKIPPED_IN_DIGEST = ("pooler.",)  # a pretrained BERT's pooler moves into the sequence head (heads/native.py)
# model options that say how the encoder runs, not what it is: no part of the base an adapter sits on
RUNTIME_OPTIONS = ("padding_free",)
MERGE_TOLERANCE = 1e-4  # export: largest |logit change| a merge may make (fp32 rounding is ~1e-6)


def linear_layer_names(encoder: nn.Module) -> list[str]:
    """The names ``mode.target_modules`` can give: the last part of every ``nn.Linear``'s name
    (``query``, ``key``, ``value``, ``dense``) and, for the ambiguous ``dense``, its parent too
    (``attention.output.dense``, ``output.dense``, ``intermediate.dense``)."""
    names: dict[str, None] = {}
    for name, module in encoder.named_modules():
        if isinstance(module, nn.Linear):
            parts = name.split(".")
            names[parts[-1]] = None
            if parts[-1] == "dense":
                names[".".join(p for p in parts[-3:] if not p.isdigit())] = None
    return list(names)


def default_target_modules(config) -> list[str]:
    """peft's table for the architecture: query and value projections for BERT, RoBERTa and
    ELECTRA, the LoRA paper's choice (Hu et al. 2021, §7.1: W_q and W_v together beat any single
    matrix at the same parameter budget)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if config.model_type not in DEFAULTS:
        raise ConfigError(f"mode=lora: no default mode.target_modules for a '{config.model_type}' encoder; "
                          "name its linear layers, e.g. mode.target_modules=[query,value]")
    return list(DEFAULTS[config.model_type])


def _matches(module_name: str, target: str) -> bool:
    return module_name == target or module_name.endswith("." + target)  # peft's rule for a list of names


def resolve_targets(encoder: nn.Module, requested: Any) -> list[str] | str:
    """``mode.target_modules`` (null: the architecture's default; a name or a list of names; or
    peft's ``all-linear``), each name checked against the encoder: one naming no module is a
    one-line error listing the encoder's linear layers."""
    if requested is None:
        return default_target_modules(encoder.config)
    if isinstance(requested, str) and requested == "all-linear":
        return "all-linear"
    targets = [requested] if isinstance(requested, str) else [str(t) for t in requested]
    if not targets:
        raise ConfigError("mode.target_modules is empty: name at least one linear layer (or null for the default)")
    modules = [name for name, _ in encoder.named_modules()]
    for target in targets:
        if not any(_matches(name, target) for name in modules):
            raise ConfigError(f"mode.target_modules: '{target}' names no module of this {encoder.config.model_type} "
                              f"encoder (its linear layers: {', '.join(linear_layer_names(encoder))})")
    return targets


def base_record(model_cfg: dict, encoder: nn.Module, seed: int) -> dict:
    """What rebuilds the base encoder of an adapter: the model options (``heads.model.encoder.load_encoder``'s
    input, a local path made absolute), the seed and pad id of a random init, its vocabulary size before a
    task added tokens, and a digest of its weights that a reload must match."""
    from heads.model.feature_cache import weights_digest

    plain = {k: v for k, v in model_cfg.items() if k not in RUNTIME_OPTIONS}
    path = plain.get("name_or_path")
    if path and os.path.isdir(os.path.expanduser(str(path))):
        plain["name_or_path"] = os.path.abspath(os.path.expanduser(str(path)))
    return {"model": plain, "seed": int(seed), "vocab_size": int(encoder.get_input_embeddings().num_embeddings),
            "pad_token_id": encoder.config.pad_token_id, "digest": weights_digest(encoder, skip=SKIPPED_IN_DIGEST)}


def rebuild_base(record: dict, where: str) -> nn.Module:
    """The base encoder of ``record`` (``base_record``), exactly: from its path or hub id, or
    re-initialised with its seed (and pad id: a record without one, written before kotune recorded it,
    gets the architecture's default, as its encoder did); weights that differ from training's are an error."""
    from omegaconf import OmegaConf

    from heads.model.encoder import ModelUnavailable, load_encoder
    from heads.model.feature_cache import weights_digest

    model_cfg = OmegaConf.create(record["model"])
    source = model_cfg.get("name_or_path") or model_cfg.get("name")
    try:
        encoder = load_encoder(model_cfg, vocab_size=int(record["vocab_size"]), seed=int(record["seed"]),
                               pad_token_id=record.get("pad_token_id"))
    except (ModelUnavailable, OSError) as e:
        raise KotuneError(f"{where}: a LoRA checkpoint holds the adapter only; its base encoder ({source}) "
                          f"cannot be loaded: {str(e).splitlines()[0]}") from None
    if weights_digest(encoder, skip=SKIPPED_IN_DIGEST) != record["digest"]:
        raise KotuneError(f"{where}: the LoRA adapter was trained on other weights than {source} holds now "
                          f"({model_cfg.get('init')} init); restore that base encoder, or retrain")
    return encoder


def new_token_rows(encoder: nn.Module, base_vocab_size: int) -> list[int]:
    """Embedding rows a task added after the base was built (RE's entity markers)."""
    return list(range(int(base_vocab_size), int(encoder.get_input_embeddings().num_embeddings)))


def lora_config(settings: dict, targets: list[str] | str, token_rows: list[int]):
    from peft import LoraConfig

    extra = {"trainable_token_indices": {"word_embeddings": token_rows}} if token_rows else {}
    return LoraConfig(r=int(settings["r"]), lora_alpha=float(settings["alpha"]), lora_dropout=float(settings["dropout"]),
                      target_modules=targets, bias="none", **extra)


def add_lora(encoder: nn.Module, settings: dict, token_rows: list[int]) -> tuple[nn.Module, list[str] | str]:
    """``encoder`` as a peft ``PeftModel`` with LoRA on ``settings['target_modules']`` (resolved)
    and trainable rows ``token_rows``; every base weight frozen."""
    from peft import get_peft_model

    targets = resolve_targets(encoder, settings.get("target_modules"))
    try:
        wrapped = get_peft_model(encoder, lora_config(settings, targets, token_rows))
    except ValueError as e:  # e.g. a LayerNorm named: LoRA needs linear (or embedding) layers
        first = str(e).splitlines()[0]
        raise ConfigError(f"mode.target_modules={targets}: peft refuses it ({first}); this encoder's linear "
                          f"layers: {', '.join(linear_layer_names(encoder))}") from None
    return wrapped, targets


def save_adapter(encoder: nn.Module, directory: str) -> None:
    # save_embedding_layers=False: peft's "auto" would ask the hub whether the vocabulary grew
    encoder.save_pretrained(os.path.join(directory, ADAPTER_DIR), save_embedding_layers=False)


def load_adapter(directory: str, record: dict, vocab_size: int) -> nn.Module:
    """The saved adapter on its rebuilt base (``record``), trainable again (a resumed or continued run)."""
    from peft import PeftModel

    base = rebuild_base(record, directory)
    if base.get_input_embeddings().num_embeddings < vocab_size:  # rows the task added; the adapter holds their values
        base.resize_token_embeddings(int(vocab_size), mean_resizing=False)
    return PeftModel.from_pretrained(base, os.path.join(directory, ADAPTER_DIR), is_trainable=True)


def is_lora_directory(path: str) -> bool:
    return os.path.exists(os.path.join(path, "adapter_config.json")) or os.path.isdir(os.path.join(path, ADAPTER_DIR))


def merge(encoder: nn.Module, where: str) -> nn.Module:
    """The plain encoder with the adapter merged into its weights (peft ``merge_and_unload``,
    refusing NaN or infinite results); ``encoder`` is changed in place."""
    try:
        return encoder.merge_and_unload(safe_merge=True)
    except ValueError as e:
        raise ConfigError(f"{where}: merging the LoRA adapter into its encoder fails ({str(e).splitlines()[0]})") from None


def merged_exactly(encoder: nn.Module, where: str) -> nn.Module:
    """The adapter merged into its base (``merge``), checked: on a fixed random batch the merged
    encoder's hidden states must equal the adapter's within ``MERGE_TOLERANCE``, else the export
    would not be the model that was trained and it is refused in one line."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(encoder.config.vocab_size), (4, 24), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    encoder.eval()
    with torch.no_grad():
        before = encoder(**inputs).last_hidden_state
        merged = merge(encoder, f"cannot export {where}")
        change = float((merged(**inputs).last_hidden_state - before).abs().max())
    if not change <= MERGE_TOLERANCE:  # NaN included
        raise ConfigError(f"cannot export {where}: merging the LoRA adapter changes the encoder's outputs by up "
                          f"to {change:.2g} (> {MERGE_TOLERANCE:g}), so the merged model would not be the trained one")
    return merged
