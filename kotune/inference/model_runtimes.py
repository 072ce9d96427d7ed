"""What runs a loaded model's batches: Trainer, or a BatchPredictor (heads/model/inference.py) over the runtime the
model's ``runtime`` attribute names (kotune/core/backends.py's Runtime, registered with
``kotune.register_runtime``), chosen once by :func:`predictor_for` (action=predict / eval) or made by
:func:`batch_predictor` (action=serve, ``kotune.load``, rerank, the teacher's score), on
``predict.device`` / ``precision`` / ``batch_tokens``; each says where its batches ran
(their ``inference_report``). A BatchPredictor gives what ``Trainer.predict`` gives, so
kotune/inference/predict.py decodes and reports either alike.

``torch`` is kotune's own model (heads/model/kotune_model.py's KotuneModel), registered here: transformers'
Trainer runs it, and every batch outside Trainer goes through :func:`torch_forward` (which runs
heads/model/inference.py's one forward on ``predict.device``). The others register
beside their model classes: ``onnxruntime`` (kotune/export/onnx.py) and ``transformers`` (kotune/api/native.py).
(kotune/devices.py is another matter: where a job runs, its devices and ranks.)"""
from __future__ import annotations

from typing import Any, Callable

from omegaconf import DictConfig

from heads.model import inference
from heads.model.inference import BatchPredictor, Inference
from kotune.core.backends import Runtime
from kotune.core.errors import ConfigError
from kotune.core.log import log
from kotune.core.registry import RUNTIMES, register_runtime
from kotune.devices import world_size
from kotune.loading.built import Built


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


def batch_predictor(cfg: DictConfig, model, collator) -> BatchPredictor:
    """The job's :class:`BatchPredictor` over ``model``: its runtime's forward on ``predict.device`` and
    ``predict.precision`` (heads/model/inference.py), ``train.eval_batch_size`` rows or
    ``predict.batch_tokens`` tokens a batch, padded by ``collator`` (the Built's). Serve,
    ``kotune.load``, rerank and the teacher's score use it."""
    runtime = runtime_of(model)
    runtime.inference = chosen = inference.of(cfg)  # what the runtime's forward runs on (Runtime.inference)
    forward = runtime.forward(model)  # the model placed: an ONNX export's provider chosen
    return BatchPredictor(forward, int(cfg.train.eval_batch_size), collator,
                          (cfg.get("predict") or {}).get("batch_tokens"), chosen, getattr(model, "provider", None))


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
        return batch_predictor(cfg, b.model, b.collator)
    from kotune.training.trainer import prediction_trainer  # transformers' Trainer: loaded once a model is to run

    return prediction_trainer(cfg, b, run_dir)
