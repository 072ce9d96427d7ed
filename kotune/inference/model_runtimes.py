"""What runs a loaded model's batches: Trainer, or a :class:`BatchPredictor` over the runtime the
model's ``runtime`` attribute names (kotune/core/backends.py's Runtime, registered with
``kotune.register_runtime``), chosen once by :func:`predictor_for` (action=predict / eval) or made by
:func:`batch_predictor` (action=serve, ``kotune.load``, rerank, the teacher's score), on
``predict.device`` / ``precision`` / ``batch_tokens``; :func:`inference_report` says where they ran.
:class:`BatchPredictor` gives what ``Trainer.predict`` gives, so kotune/inference/predict.py decodes
and reports either alike.

``torch`` is kotune's own model (heads/model/kotune_model.py's KotuneModel), registered here: transformers'
Trainer runs it, and every batch outside Trainer goes through :func:`torch_forward` (which runs
heads/model/inference.py's one forward on ``predict.device``). The others register
beside their model classes: ``onnxruntime`` (kotune/export/onnx.py) and ``transformers`` (kotune/api/native.py).
(kotune/devices.py is another matter: where a job runs, its devices and ranks.)"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig

from heads.model import inference
from heads.model.inference import Inference, row_sizes, token_batches
from kotune.core.backends import Runtime
from kotune.core.errors import ConfigError
from kotune.core.log import log
from kotune.core.registry import RUNTIMES, register_runtime
from kotune.devices import world_size
from kotune.loading.built import Built, make_collator
from tasks.base import IGNORE


@register_runtime("torch")
class TorchRuntime(Runtime):
    """A KotuneModel: Trainer runs it; its saved mode is checked against the job's."""

    trainer = True
    kotune_model = True
    kind = "kotune"

    def forward(self, model: Any) -> Callable[[dict], Any]:
        return torch_forward(model, self.inference)


def runtime_of(model: Any) -> Runtime:
    """The runtime ``model.runtime`` names. The module of the model's class registered it (this one
    registers ``torch``); one that is not registered is one line listing those that are."""
    return RUNTIMES.get(str(model.runtime))()


def torch_forward(model, inference: Inference | None = None) -> Callable[[dict], Any]:
    """A KotuneModel's logits of one padded batch, as numpy (the labels in a batch are left out): the
    model moved once to ``inference``'s device, each batch through its one forward
    (heads/model/inference.py: inputs moved, autocast, outputs back to the CPU)."""
    inference = inference or Inference()
    inference.place(model)

    def forward(batch: dict) -> Any:
        return inference.forward(model, **{k: v for k, v in batch.items() if k not in model.head.label_fields})

    return forward


def batch_forward(model: Any, inference: Inference | None = None) -> Callable[[dict], Any]:
    """What runs ``model``'s padded batches outside Trainer, as its runtime says, on ``inference``'s
    device and precision (the runtime reads :attr:`Runtime.inference`)."""
    runtime = runtime_of(model)
    runtime.inference = inference or Inference()
    return runtime.forward(model)


def onnx_run_on(model: Any, inference: Inference | None) -> None:
    """An ONNX export's session (kotune/export/onnx.py's OnnxModel) on ``inference``'s device:
    onnxruntime's CUDAExecutionProvider for cuda:N where this onnxruntime has it, else the CPU's
    (a CUDA device named explicitly without it: one line); ``model.provider`` and the log say which."""
    import onnxruntime as ort

    inference = inference or Inference()
    device, available = inference.device, ort.get_available_providers()
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda") and "CUDAExecutionProvider" in available:
        import torch

        index = device.partition(":")[2]  # cuda alone: the current device (a torchrun rank's own)
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(index) if index else torch.cuda.current_device()}))
    elif device.startswith("cuda") and inference.explicit:
        raise ConfigError(f"predict.device={device}: this onnxruntime has no CUDAExecutionProvider (it has "
                          f"{', '.join(available)}; install onnxruntime-gpu); use predict.device=cpu or auto")
    if inference.precision != "fp32":
        log(f"predict.precision={inference.precision}: an ONNX export runs its graph as exported ({model.file})")
    if len(providers) > 1:
        model.session = ort.InferenceSession(model.path, model.options, providers=providers)
    model.provider = model.session.get_providers()[0]
    fallback = device.startswith("cuda") and model.provider == "CPUExecutionProvider"
    log(f"onnxruntime runs {model.file} on {model.provider}"
        + (f" (predict.device=auto found {device}; this onnxruntime has no CUDA provider)" if fallback else ""))


def concat_padded(parts: list) -> Any:
    """Batch outputs as one array per output, as ``Trainer.predict`` joins them: rows stacked, a
    token axis (axis 1) that differs between batches padded with -100 (decoders read real slots only)."""
    if isinstance(parts[0], tuple):
        return tuple(concat_padded([p[k] for p in parts]) for k in range(len(parts[0])))
    parts = [np.asarray(p) for p in parts]
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts)
    out = np.full((sum(len(p) for p in parts), max(p.shape[1] for p in parts), *parts[0].shape[2:]), IGNORE,
                  dtype=parts[0].dtype)
    row = 0
    for p in parts:
        out[row:row + len(p), : p.shape[1]] = p
        row += len(p)
    return out


class BatchPredictor:
    """``Trainer.predict`` for a model Trainer does not run: rows in the order given, ``batch_size``
    at a time (or, with ``batch_tokens``, as many as keep rows × padded length within it: a long
    request is split, never one batch past the budget), padded by the training collator, through
    ``forward`` (a padded batch → logits)."""

    def __init__(self, forward: Callable[[dict], Any], batch_size: int, collator, batch_tokens: int | None = None):
        self.forward, self.batch_size, self.collator = forward, max(1, int(batch_size)), collator
        self.batch_tokens = batch_tokens
        self.inference: inference.Inference | None = None  # set by batch_predictor: reported, not read

    def predict(self, rows):
        from transformers.trainer_utils import PredictionOutput

        started, parts = time.perf_counter(), []
        sizes = row_sizes(rows) if self.batch_tokens else [(1, 1)] * len(rows)  # no budget: batch_size rows
        for batch in token_batches(sizes, self.batch_tokens, self.batch_size, getattr(self.collator, "multiple", 1)):
            parts.append(self.forward(self.collator([rows[i] for i in batch])))  # rows read a batch at a time
        speed = len(rows) / max(time.perf_counter() - started, 1e-9)
        return PredictionOutput(predictions=concat_padded(parts), label_ids=None,
                                metrics={"test_samples_per_second": speed})


def batch_predictor(cfg: DictConfig, model, tokenizer) -> BatchPredictor:
    """The job's :class:`BatchPredictor` over ``model``: its runtime's forward on ``predict.device`` and
    ``predict.precision`` (heads/model/inference.py), ``train.eval_batch_size`` rows or
    ``predict.batch_tokens`` tokens a batch. Serve, ``kotune.load``, rerank and the teacher's score use it."""
    options, chosen = cfg.get("predict") or {}, inference.of(cfg)
    predictor = BatchPredictor(batch_forward(model, chosen), int(cfg.train.eval_batch_size),
                               make_collator(tokenizer, cfg), inference.check_batch_tokens(options.get("batch_tokens")))
    predictor.inference = chosen
    return predictor


def inference_report(model, predictor) -> dict:
    """Where the batches ran (results.json ``inference``, serve's /health): the device, precision and
    token budget; an ONNX export's execution provider; ``trainer`` when Trainer ran them."""
    if not isinstance(predictor, BatchPredictor):  # Trainer: train.* (bf16, fp16, use_cpu) decide
        args = predictor.args
        precision = "bf16" if args.bf16_full_eval else "fp16" if args.fp16_full_eval else "fp32"
        return {"device": str(args.device), "precision": precision, "batch_tokens": None, "provider": None,
                "runner": "trainer"}
    chosen = predictor.inference or inference.Inference()
    return {**chosen.describe(), "batch_tokens": predictor.batch_tokens,
            "provider": getattr(model, "provider", None), "runner": "kotune"}


def outside_trainer(cfg: DictConfig) -> bool:
    """Whether a checkpoint's eval/predict runs through :func:`batch_predictor` rather than Trainer:
    when ``predict.device``, ``precision`` or ``batch_tokens`` is set (Trainer reads train.*). One
    process: under torchrun they are refused in one line."""
    options = cfg.get("predict") or {}
    chosen = [f"predict.{k}={options.get(k)}" for k, default in (("device", "auto"), ("precision", "fp32"),
                                                                  ("batch_tokens", None))
              if options.get(k, default) not in (default, None)]
    if chosen and world_size() > 1:
        raise ConfigError(f"{', '.join(chosen)}: set for one process; under torchrun evaluation runs in "
                          "Trainer on every rank (leave predict.device, precision and batch_tokens unset)")
    return bool(chosen)


def predictor_for(cfg: DictConfig, b: Built, run_dir: str):
    """What runs the batches, as the model's runtime says: Trainer for a checkpoint (unless
    :func:`outside_trainer`), :class:`BatchPredictor` for an ONNX export."""
    if not runtime_of(b.model).trainer or outside_trainer(cfg):
        return batch_predictor(cfg, b.model, b.tokenizer)
    from kotune.training.trainer import prediction_trainer  # transformers' Trainer: loaded once a model is to run

    return prediction_trainer(cfg, b, run_dir)
