"""What runs a loaded model's batches: the runtime its ``runtime`` attribute names (kotune/core/backends.py's
Runtime, registered with ``kotune.register_runtime``), asked by action=predict / eval
(kotune/inference/predict.py), the loader's mode check (kotune/loading/reconcile.py) and action=serve / ``kotune.load``
(kotune/serving/app.py, kotune/api/predictor.py).

``torch`` is kotune's own model (heads/model/kotune_model.py's KotuneModel), registered here: transformers'
Trainer runs it, and every batch outside Trainer goes through :func:`torch_forward` (which runs
heads/model/inference.py's one forward on ``predict.device``). The others register
beside their model classes: ``onnxruntime`` (kotune/export/onnx.py) and ``transformers`` (kotune/api/native.py).
(kotune/devices.py is another matter: where a job runs, its devices and ranks.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from kotune.core.backends import Runtime
from kotune.core.registry import RUNTIMES, register_runtime

if TYPE_CHECKING:  # imported where a batch runs: it brings torch, which a config mistake is answered before
    from heads.model.inference import Inference


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
    from heads.model.inference import Inference

    inference = inference or Inference()
    inference.place(model)

    def forward(batch: dict) -> Any:
        return inference.forward(model, **{k: v for k, v in batch.items() if k not in model.head.label_fields})

    return forward


def batch_forward(model: Any, inference: Inference | None = None) -> Callable[[dict], Any]:
    """What runs ``model``'s padded batches outside Trainer, as its runtime says, on ``inference``'s
    device and precision (the runtime reads :attr:`Runtime.inference`)."""
    from heads.model.inference import Inference

    runtime = runtime_of(model)
    runtime.inference = inference or Inference()
    return runtime.forward(model)


def onnx_run_on(model: Any, inference: Inference | None) -> None:
    """An ONNX export's session (kotune/export/onnx.py's OnnxModel) on ``inference``'s device:
    onnxruntime's CUDAExecutionProvider for cuda:N where this onnxruntime has it, else the CPU's
    (a CUDA device named explicitly without it: one line); ``model.provider`` and the log say which."""
    import onnxruntime as ort

    from heads.model.inference import Inference
    from kotune.core.errors import ConfigError
    from kotune.core.log import log

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
