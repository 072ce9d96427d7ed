"""``action=distill``'s teacher, as it was saved: a kotune run (or its ``model/``: fine-tuned, LoRA
with its adapter merged once, frozen), an ONNX export (run by onnxruntime, fp32 or ``onnx.file=``
its int8 file) or a native export (the architecture's transformers class). Each is checked as
predict and serve check it (kotune.json key by key, the manifest's digests); every one gives its
logits (heads/distill/teacher_cache.py's :class:`TeacherSource`) and the batches its score is taken
on. Only a run lends its layers and hidden states: an export's weights are not kotune's encoder and
head, so its student is ``model=`` or ``distill.student_hidden=H`` (its ``config.json``)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
from omegaconf import DictConfig, OmegaConf

from heads.model.inference import Inference, of as inference_of
from kotune.loading.built import Encoder
from kotune.core.atomic_dir import MANIFEST
from kotune.core.errors import ConfigError
from kotune.core.log import log


def teacher_source_kind(path: str) -> str:
    from kotune.export.native_card import is_native_export
    from kotune.export.onnx import is_onnx_export

    return "onnx" if is_onnx_export(path) else "native" if is_native_export(path) else "run"


def file_digest(folder: str) -> str:
    """sha256 of the teacher's manifest (which holds every saved file's size and digest)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return "none (saved without a manifest)"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Teacher:
    """The loaded teacher: ``side`` (its tokenizer, config, length, model), where it was read from,
    and what distillation asks of it."""

    def __init__(self, cfg: DictConfig, path: str):
        from kotune.loading.checkpoint import read_checkpoint
        from kotune.loading.from_checkpoint import encoder_of, onnx_settings

        self.path, self.source = path, teacher_source_kind(path)
        if self.source == "native":
            self.folder, self.side = path, native_side(cfg, path)
            self.mode = None
        else:
            # a run: nothing saved there, or a file not as saved, is one line; an ONNX export: its spec and manifest
            checkpoint = read_checkpoint(path, onnx_settings(cfg) if self.source == "onnx" else None)
            self.folder = checkpoint.folder
            self.side = encoder_of(OmegaConf.merge(cfg, {"checkpoint": path}), checkpoint)
            self.mode = checkpoint.model.mode if self.source == "run" else checkpoint.spec.get("mode")
        self.model = self.side.model
        self.inference = inference_of(cfg)  # predict.device, predict.precision: its logits and its score
        if cfg.model.get("padding_free"):  # model.padding_free: the teacher's encoder runs packed too, where it can
            if self.source == "run":
                self.model.set_padding_free(True)
            else:
                log(f"model.padding_free: the teacher, a {self.source} export, runs its graph as exported (padded)")
        if self.source == "run" and self.model.lora:  # its adapter merged once: the plain encoder computes its logits and lends layers
            self.model.encoder = self.model.bare_encoder()

    @property
    def kotune_model(self):
        """The KotuneModel of a run, None for an export."""
        return self.model if self.source == "run" else None

    @property
    def meta(self) -> dict:
        return self.model.meta

    @property
    def config(self):
        return self.side.config

    def describe(self) -> str:
        if self.source == "run":
            return "kotune run"
        return f"{self.source} export ({self.model.describe()})"

    def params(self) -> int | None:
        if self.source == "run":
            return self.model.param_counts()["total_params"]
        if self.source == "native":
            return sum(p.numel() for p in self.model.native.parameters())
        return None  # an ONNX graph's weights are initializers, not parameters

    def logits_source(self):
        """heads/distill/teacher_cache.py's TeacherSource: the logits of one padded batch."""
        import torch

        from heads.distill.teacher_cache import TeacherSource, kotune_teacher

        if self.source == "run":
            return kotune_teacher(self.model, self.inference)
        model = self.model
        model.run_on(self.inference)  # an export runs where predict.device says (its provider, its device)

        def logits(input_ids, attention_mask, token_type_ids=None, **extra):
            batch = {k: v.cpu().numpy() for k, v in {"input_ids": input_ids, "attention_mask": attention_mask,
                                                     "token_type_ids": token_type_ids, **extra}.items() if v is not None}
            out = model(batch)
            if isinstance(out, tuple):
                return tuple(torch.from_numpy(np.asarray(x, dtype=np.float32)) for x in out)
            return torch.from_numpy(np.asarray(out, dtype=np.float32))

        # an export is its files: the manifest's digests (every file) name it (and a precision other than fp32)
        precision = "" if self.inference.precision == "fp32" else f":{self.inference.precision}"
        return TeacherSource(logits, f"{self.source}:{file_digest(self.folder)}:{getattr(model, 'file', None)}{precision}",
                             model.head_description(), getattr(self.config, "pad_token_id", None) or 0,
                             Inference())  # the batch reaches the export on the CPU, as numpy


def native_side(cfg: DictConfig, path: str) -> Encoder:
    """A native export read for the run's task (which the export's model card lends when task= is
    not given: kotune/loading/checkpoint.py), checked against its manifest."""
    from kotune.api.native import checked_native_export, load_native
    from tasks import build_task

    checked_native_export(path)
    model, tokenizer = load_native(path, build_task(cfg.task))
    return Encoder(tokenizer, model.native.config, int(model.meta["max_length"]), bool(model.meta["token_type_ids"]),
                   model=model, encoder=None)


def refuse_layer_copy(teacher: Teacher, layers: int | None, hidden: int | None) -> None:
    """A student made of the teacher's layers needs a run's weights: an export lends its logits only."""
    if teacher.source != "run" and layers is not None and hidden is None:
        raise ConfigError(f"distill.teacher={teacher.path} is a {teacher.source} export: a student copies a kotune "
                          "run's layers and head (distill.student_layers=K), an export lends its logits only; give "
                          "the run it was exported from, or the student as model= or distill.student_hidden=H")
