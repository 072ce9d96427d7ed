"""Encoder + head as one ``nn.Module`` for ``transformers.Trainer``, and its save/load format.

A saved model directory holds ``kotune.json`` (head kind, head arguments, label names, mode),
``encoder/`` (``save_pretrained`` of the encoder: config + weights), ``head.safetensors`` and the
tokenizer files, so ``action=eval`` reloads it with no hub access.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from heads import HEADS
from tasks.errors import ConfigError, KotuneError


class KotuneModel(nn.Module):
    def __init__(self, encoder: nn.Module, head_kind: str, head_kwargs: dict, *, frozen: bool = False,
                 meta: dict | None = None):
        super().__init__()
        if head_kind not in HEADS:
            raise ConfigError(f"unknown head '{head_kind}' (choices: {', '.join(sorted(HEADS))})")
        self.encoder = encoder
        self.head_kind, self.head_kwargs = head_kind, dict(head_kwargs)
        self.head = HEADS[head_kind](encoder.config.hidden_size, **head_kwargs)
        self.frozen = frozen
        self.meta = dict(meta or {})
        self.config = encoder.config  # Trainer and accelerate look for .config
        if frozen:
            self.encoder.requires_grad_(False)
            self.encoder.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:  # a fixed feature extractor: no dropout in the encoder, ever
            self.encoder.eval()
        return self

    def encode(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            return self.encoder(**kwargs).last_hidden_state

    def forward(self, input_ids, attention_mask, token_type_ids=None, **inputs):
        inputs.pop("num_items_in_batch", None)  # Trainer sends it to forwards that take **kwargs
        labels = {k: inputs.pop(k) for k in self.head.label_fields if k in inputs}
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.head(hidden, attention_mask, **inputs)
        out = {"logits": logits}
        if labels and all(v is not None for v in labels.values()):
            out["loss"] = self.head.loss(logits, **labels)
        return out

    def param_counts(self) -> dict[str, int]:
        return {"trainable_params": sum(p.numel() for p in self.parameters() if p.requires_grad),
                "total_params": sum(p.numel() for p in self.parameters()),
                "head_params": sum(p.numel() for p in self.head.parameters())}

    # ---- persistence ---------------------------------------------------------------------
    def save(self, directory: str, tokenizer=None) -> None:
        os.makedirs(directory, exist_ok=True)
        self.encoder.save_pretrained(os.path.join(directory, "encoder"))
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()},
                  os.path.join(directory, "head.safetensors"))
        spec = {"head": self.head_kind, "head_kwargs": self.head_kwargs, "frozen": self.frozen,
                "meta": self.meta, "format": 1}
        with open(os.path.join(directory, "kotune.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)

    @classmethod
    def load(cls, directory: str) -> "KotuneModel":
        from transformers import AutoConfig, AutoModel

        from heads.encoder import no_pooler

        spec_path = os.path.join(directory, "kotune.json")
        if not os.path.exists(spec_path):
            raise KotuneError(f"{directory}: no saved kotune model (kotune.json missing); "
                              "point checkpoint= at a run directory's model/ or the run directory")
        with open(spec_path, encoding="utf-8") as f:
            spec = json.load(f)
        encoder_dir = os.path.join(directory, "encoder")
        encoder = AutoModel.from_pretrained(encoder_dir, **no_pooler(AutoConfig.from_pretrained(encoder_dir)))
        model = cls(encoder, spec["head"], spec["head_kwargs"], frozen=spec["frozen"], meta=spec["meta"])
        model.head.load_state_dict(load_file(os.path.join(directory, "head.safetensors")))
        return model
