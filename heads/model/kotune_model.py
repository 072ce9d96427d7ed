"""Encoder + head as one ``nn.Module`` for ``transformers.Trainer``, and its save/load format.

A saved model directory holds ``kotune.json`` (head kind, head arguments, label names, mode,
layer choice and the learned scalar-mix weights for reading), ``encoder/`` (``save_pretrained`` of
the encoder: config + weights), ``head.safetensors``, ``layers.safetensors`` (scalar mix only) and
the tokenizer files, so ``action=eval`` reloads it with no hub access. Under ``mode=lora``
``adapter/`` (peft's adapter: LoRA weights and any trained token rows) replaces ``encoder/``, and
``kotune.json`` records the base encoder it sits on (heads/model/lora.py), rebuilt and checked on load.

The forward is split in two for the frozen feature cache: ``layer_states`` (the encoder's fixed
output for ``mode.layers``) and ``mixer`` + head (what trains); ``forward(layer_states=...)``
skips the encoder.
"""
from __future__ import annotations

import inspect
import json
import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from heads.registry import HEADS, resolve
from heads.model.layers import LayerMixer, check_pooling, parse_layers
from heads.loss import checked_counts, checked_sums, mean_of_terms
from heads.native import native_arguments, takes_pooler
from kotune.core.atomic_dir import MANIFEST, settle, verify_manifest, written_whole
from kotune.core.errors import ConfigError, KotuneError


FORMAT = 2  # 2: heads shaped as the architecture's own (kotune.json records the sequence head's)


class KotuneModel(nn.Module):
    """``layers`` (``mode.layers``) picks the hidden states the head reads (heads/model/layers.py);
    ``pooling`` (``mode.pooling``) is passed to heads that pool (their ``pooling`` argument)."""

    # forward(num_items_in_batch=...) divides the head's loss sums by the item counts of the whole
    # optimizer step (all micro-batches, all processes: KotuneTrainer counts them with loss_counts),
    # so Trainer neither divides by grad_accum nor lets a micro-batch's mean weigh as much as
    # another's whatever its number of items (heads/loss.py).
    accepts_loss_kwargs = True
    # how kotune runs it: the ``torch`` runtime (kotune/inference/model_runtimes.py), which Trainer runs and whose mode is checked
    runtime = "torch"

    def __init__(self, encoder: nn.Module, head_kind: str, head_kwargs: dict, *, frozen: bool = False,
                 meta: dict | None = None, layers: Any = "last", pooling: str | None = None,
                 pooler_state: dict | None = None, lora: dict | None = None):
        super().__init__()
        self.pooler_state = pooler_state  # the encoder's pooler weights, once taken out of it (_native_head)
        head_kind, head_kwargs = resolve(head_kind, head_kwargs)  # a kind of older kotune: a head with options
        HEADS.get(head_kind)  # an unknown kind: one line with the choices
        self.encoder = encoder
        self.head_kind, self.head_kwargs = head_kind, dict(head_kwargs)
        if check_pooling(pooling) is not None:
            if "pooling" not in inspect.signature(HEADS.get(head_kind)).parameters:
                raise ConfigError(f"mode.pooling={pooling} does not fit the {head_kind} head: it reads "
                                  "every token and pools nothing (leave mode.pooling unset)")
            self.head_kwargs["pooling"] = pooling
        self.mixer = LayerMixer(parse_layers(layers, int(encoder.config.num_hidden_layers)))
        self.head = self._native_head(encoder, head_kind)
        self.lora = self._add_lora(lora)
        self.frozen = frozen
        self.meta = dict(meta or {})
        self.windows = None  # task.long_text=windows: tasks.windows.WindowOptions (set by kotune.loading.build)
        # model.padding_free: how the encoder is run, not what it holds; never saved (set_padding_free)
        self.padding_free = False
        self.config = encoder.config  # Trainer and accelerate look for .config
        if frozen:
            self.encoder.requires_grad_(False)
            self.encoder.eval()

    def _native_head(self, encoder: nn.Module, head_kind: str) -> nn.Module:
        """The head in its architecture's native shape and init (heads/native.py). BERT's sequence
        head takes over the encoder's pooler (the checkpoint's, when it has one) unless it reads
        concatenated layers; any pooler then leaves the encoder (the head pools, and unused
        parameters would break DDP), its weights kept in ``pooler_state`` for :meth:`with_layers`."""
        config = encoder.config
        head_class = HEADS.get(head_kind)
        self.head_kwargs, native_init = native_arguments(config, head_class, self.head_kwargs)
        head = head_class(config.hidden_size * self.mixer.spec.width, **self.head_kwargs, **native_init)
        pooler = getattr(encoder, "pooler", None)
        if pooler is not None:
            self.pooler_state = pooler.dense.state_dict() if hasattr(pooler, "dense") else None
            encoder.pooler = None
        if (self.pooler_state is not None and takes_pooler(config, head_class) and self.mixer.spec.width == 1
                and self.head_kwargs.get("architecture") == "bert"):
            head.dense.load_state_dict(self.pooler_state)
        return head

    def _add_lora(self, settings: dict | None) -> dict | None:
        """``mode=lora``: the encoder as a peft model with LoRA adapters (heads/model/lora.py), unless it
        is one already (a saved adapter on its rebuilt base). Returns the settings as resolved."""
        if settings is None:
            return None
        from heads.model.lora import add_lora

        settings = dict(settings)
        if not hasattr(self.encoder, "peft_config"):
            self.encoder, settings["target_modules"] = add_lora(self.encoder, settings, settings.get("token_rows") or [])
        settings["vocab_size"] = int(self.encoder.config.vocab_size)  # with the rows a task added
        return settings

    def head_description(self) -> str:
        """The head kind with its options: ``token (crf=true)``."""
        return self.head.describe()

    @property
    def mode(self) -> str:
        return "lora" if self.lora else "frozen" if self.frozen else "finetune"

    def bare_encoder(self) -> nn.Module:
        """The encoder alone, to read features from (``action=probe``): a LoRA adapter merged into
        its base (this model's encoder is changed in place; it computes the same)."""
        if not self.lora:
            return self.encoder
        from heads.model.lora import merge

        return merge(self.encoder, f"the {self.meta.get('task')} checkpoint")

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """What a Trainer checkpoint holds: what trains (frozen: the head and mix; LoRA: the
        adapter too), or everything when the whole encoder trains."""
        state = self.state_dict()
        if not (self.frozen or self.lora):
            return state
        trained = {f"encoder.{n}" for n, p in self.encoder.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if not k.startswith("encoder.") or k in trained}

    def with_layers(self, layers: Any) -> "KotuneModel":
        """A new head of this kind on this model's encoder (shared, not copied), reading ``layers``
        and initialised as this model's head was (``action=probe``: one encoder, a head per choice)."""
        model = KotuneModel(self.encoder, self.head_kind, self.head_kwargs, frozen=self.frozen, meta=self.meta,
                            layers=layers, pooler_state=self.pooler_state, lora=self.lora)
        model.padding_free = self.padding_free  # the same encoder, run the same way
        return model

    def set_padding_free(self, on: bool) -> None:
        """``model.padding_free``: the encoder reads each batch's real tokens packed into one row
        (heads/model/packing.py); refused in one line where this encoder or transformers cannot."""
        if on:
            from heads.model.packing import check_padding_free

            check_padding_free(self.encoder)
        self.padding_free = bool(on)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:  # a fixed feature extractor: no dropout in the encoder, ever
            self.encoder.eval()
        return self

    def layer_states(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """The encoder's fixed output for ``mode.layers``: [B, T, K, H] (what the frozen cache
        stores; K = 1 unless the scalar mix needs every layer)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            return self.mixer.states(self.encoder, input_ids, attention_mask, token_type_ids, self.padding_free)

    def encode(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """The hidden states the head reads: [B, T, H]."""
        return self.mixer(self.layer_states(input_ids, attention_mask, token_type_ids))

    def loss_counts(self, batch: dict) -> torch.Tensor | None:
        """Per term of the head's loss, the labelled items of ``batch`` (None: it has no labels)."""
        if not all(k in batch for k in self.head.label_fields):
            return None
        return checked_counts(self.head, self.head.loss_counts(**{k: batch[k] for k in self.head.label_fields}))

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, layer_states=None,
                num_items_in_batch=None, **inputs):
        """``layer_states`` (from the frozen feature cache) replaces running the encoder.
        ``num_items_in_batch`` (Trainer's): the ``loss_counts`` of the whole optimizer step the
        loss is a share of (None: this batch's own, the loss is its mean)."""
        labels = {k: inputs.pop(k) for k in self.head.label_fields if k in inputs}
        window_doc = inputs.pop("window_doc", None)
        if window_doc is not None:  # a batch of documents, each a run of windows (heads/model/windows.py)
            logits = self.document_logits(input_ids, attention_mask, token_type_ids, window_doc, inputs)
        else:
            logits = self.tokens_logits(input_ids, attention_mask, token_type_ids, layer_states, inputs)
        out = {"logits": logits}
        if labels and all(v is not None for v in labels.values()):
            sums = checked_sums(self.head, self.head.loss_sums(logits, **labels))  # a plug-in's mistake: one line
            counts = (checked_counts(self.head, self.head.loss_counts(**labels), len(sums)) if num_items_in_batch is None
                      else num_items_in_batch)
            out["loss"] = mean_of_terms(sums, counts)
        return out

    def tokens_logits(self, input_ids, attention_mask, token_type_ids, layer_states, inputs: dict):
        if layer_states is None:
            layer_states = self.layer_states(input_ids, attention_mask, token_type_ids)
        else:  # stored in fp16: compute in the head's precision
            layer_states = layer_states.to(next(self.head.parameters()).dtype)
        return self.head(self.mixer(layer_states), attention_mask, **inputs)

    def document_logits(self, input_ids, attention_mask, token_type_ids, window_doc, inputs: dict):
        """Each document's logits, pooled over its windows; the encoder reads at most
        ``windows.max_per_batch`` windows at a time."""
        from heads.model.windows import in_chunks, pool_windows

        if self.windows is None:
            raise ConfigError("a batch of windowed documents for a model without task.long_text=windows")

        def window_logits(ids, mask, types):
            return self.head(self.encode(ids, mask, types), mask, **inputs)

        recompute = self.training and torch.is_grad_enabled() and not self.frozen
        logits = in_chunks(window_logits, [input_ids, attention_mask, token_type_ids], self.windows.max_per_batch,
                           recompute)
        return pool_windows(logits, window_doc, self.windows.pool)

    def weighting_refusal(self) -> str | None:
        """Why ``train.class_weights`` cannot apply to this model's head, or None when it can."""
        from heads.loss import WeightedCrossEntropy

        if not isinstance(self.head, WeightedCrossEntropy):
            return f"the {self.head_kind} head's loss has no class weights (the sequence and token heads' do)"
        why = self.head.weighting()
        return f"the {self.head_kind} head cannot weight classes: {why}" if why else None

    def set_class_weights(self, weights: list[float]) -> None:
        """``train.class_weights``: each class's term in the head's loss, kept with the head's arguments."""
        why = self.weighting_refusal()
        if why:
            raise ConfigError(f"train.class_weights: {why}")
        self.head.set_class_weights(weights)
        self.head_kwargs["class_weights"] = [float(w) for w in weights]

    def param_counts(self) -> dict[str, int]:
        return {"trainable_params": sum(p.numel() for p in self.parameters() if p.requires_grad),
                "total_params": sum(p.numel() for p in self.parameters()),
                "head_params": sum(p.numel() for p in self.head.parameters()),
                "mix_params": sum(p.numel() for p in self.mixer.parameters())}

    def report(self) -> dict:
        """What results.json says about the model (kotune/inference/predict.py's run_report)."""
        return {**self.param_counts(), **self.mixer.report(), "pooling": getattr(self.head, "pooling", None)}

    def describe(self) -> str:
        return self.mixer.describe_mix()

    # ---- persistence ---------------------------------------------------------------------
    def save(self, directory: str, tokenizer=None) -> None:
        """Write the model to ``directory`` whole or not at all (kotune/core/atomic_dir.py): every file goes
        to a temporary sibling, ``kotune_manifest.json`` (sizes and sha256) is written last, and the
        finished directory replaces ``directory`` in one step, so a save killed midway leaves the
        previous model as it was."""
        with written_whole(directory, "kotune-model") as staging:
            if self.lora:
                from heads.model.lora import save_adapter

                save_adapter(self.encoder, staging)
            else:
                self.encoder.save_pretrained(os.path.join(staging, "encoder"))
            save_file({k: v.contiguous() for k, v in self.head.state_dict().items()},
                      os.path.join(staging, "head.safetensors"))
            if self.mixer.scalar_mix is not None:
                save_file({k: v.contiguous() for k, v in self.mixer.state_dict().items()},
                          os.path.join(staging, "layers.safetensors"))
            spec = {"head": self.head_kind, "head_kwargs": self.head_kwargs, "frozen": self.frozen,
                    "mode": self.mode, "lora": self.lora, "meta": self.meta, "format": FORMAT,
                    "manifest": MANIFEST, **self.mixer.report()}
            with open(os.path.join(staging, "kotune.json"), "w", encoding="utf-8") as f:
                json.dump(spec, f, ensure_ascii=False, indent=2)
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)

    @staticmethod
    def spec(directory: str) -> dict:
        """The saved kotune.json: head kind, head arguments, meta (task, labels, options), layers."""
        settle(directory)  # a save killed while swapping its directory in: put the whole one back
        spec_path = os.path.join(directory, "kotune.json")
        if not os.path.exists(spec_path):
            raise KotuneError(f"{directory}: no saved kotune model (kotune.json missing); "
                              "point checkpoint= at a run directory's model/ or the run directory")
        from heads.model.artifact import check_files, check_model_spec, parse

        check_files(directory, directory)  # before any file is opened: a link out of the directory is refused
        with open(spec_path, encoding="utf-8") as f:
            spec = check_model_spec(parse(f.read(), spec_path), spec_path)  # data only: heads/model/artifact.py
        return spec

    @classmethod
    def load(cls, directory: str, spec: dict | None = None) -> "KotuneModel":
        """The model saved in ``directory``; ``spec``: its kotune.json as already read and checked
        (kotune/loading/checkpoint.py reads a checkpoint's once), else read and checked here."""
        from transformers import AutoConfig, AutoModel

        from heads.model.artifact import ArtifactError, check_against_weights, check_sizes, check_weights
        from heads.model.encoder import no_pooler

        spec = cls.spec(directory) if spec is None else spec
        # saved with a manifest (kotune.json says so): every file as it was written; older saves have none
        verify_manifest(directory, bool(spec.get("manifest")), "retrain, or save the model again")
        check_weights(directory)
        spec = dict(spec, head_kwargs=dict(spec.get("head_kwargs") or {}))
        if spec.get("format", 1) < 2 and resolve(spec["head"], {})[0] == "sequence":
            spec["head_kwargs"]["architecture"] = "roberta"  # format 1: dropout → dense → tanh → dropout → out
        if spec.get("lora"):
            from heads.model.lora import load_adapter

            encoder = load_adapter(directory, spec["lora"]["base"], spec["lora"]["vocab_size"])
            check_sizes(directory, spec, encoder.config, "the base encoder's config")
        else:
            encoder_dir = os.path.join(directory, "encoder")
            try:
                config = AutoConfig.from_pretrained(encoder_dir)
                check_sizes(directory, spec, config)  # every size against the weights, before anything is built
                check_against_weights(lambda: AutoModel.from_config(config, **no_pooler(config)), encoder_dir,
                                      "not the weights its config.json describes")
                encoder = AutoModel.from_pretrained(encoder_dir, **no_pooler(config))
            except (OSError, ValueError, TypeError, KeyError, RuntimeError) as e:  # the files', not kotune's
                raise ArtifactError(f"{encoder_dir}: its config.json and weights do not make an encoder "
                                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        model = cls(encoder, spec["head"], spec["head_kwargs"], frozen=spec["frozen"], meta=spec["meta"],
                    layers=spec.get("layers", "last"), lora=spec.get("lora"))
        parts = [(model.head, "head.safetensors")]
        if model.mixer.scalar_mix is not None:
            parts.append((model.mixer, "layers.safetensors"))
        for part, name in parts:
            try:
                part.load_state_dict(load_file(os.path.join(directory, name)))
            except RuntimeError as e:  # keys or shapes other than kotune.json's arguments give
                raise ArtifactError(f"{os.path.join(directory, name)}: not the weights kotune.json describes "
                                    f"({' '.join(str(e).split())[:300]})") from None
        return model
