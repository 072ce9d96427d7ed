"""What runs a loaded model's batches: the runtime its ``runtime`` attribute names (kotune/core/backends.py's
Runtime, registered with ``kotune.register_runtime``), asked by action=predict / eval
(kotune/predict.py), the loader's mode check (kotune/build.py) and action=serve / ``kotune.load``
(kotune/serving/app.py, kotune/api/predictor.py).

``torch`` is kotune's own model (heads/model/kotune_model.py's KotuneModel), registered here: transformers'
Trainer runs it, and the server's batches go through :func:`torch_forward`. The others register
beside their model classes: ``onnxruntime`` (kotune/export/onnx.py) and ``transformers`` (kotune/api/native.py).
(kotune/runtime.py is another matter: where a job runs, its devices and ranks.)"""
from __future__ import annotations

from typing import Any, Callable

from kotune.core.backends import Runtime
from kotune.core.registry import RUNTIMES, register_runtime


@register_runtime("torch")
class TorchRuntime(Runtime):
    """A KotuneModel: Trainer runs it; its saved mode is checked against the job's."""

    trainer = True
    kotune_model = True
    kind = "kotune"

    def forward(self, model: Any) -> Callable[[dict], Any]:
        return torch_forward(model)


def runtime_of(model: Any) -> Runtime:
    """The runtime ``model.runtime`` names. The module of the model's class registered it (this one
    registers ``torch``); one that is not registered is one line listing those that are."""
    return RUNTIMES.get(str(model.runtime))()


def torch_forward(model) -> Callable[[dict], Any]:
    """A KotuneModel's logits of one padded batch, as numpy (the labels in a batch are left out)."""
    import torch

    model.eval()

    def forward(batch: dict) -> Any:
        with torch.inference_mode():
            logits = model(**{k: v for k, v in batch.items() if k not in model.head.label_fields})["logits"]
        if isinstance(logits, tuple):
            return tuple(x.float().numpy() for x in logits)
        return logits.float().numpy()

    return forward
