"""What an export format and a runtime are: the contract each registered class carries, so that a
package outside the repository adds either with one class (``kotune.register_exporter``,
``kotune.register_runtime``) and no switch to edit.

An **export format** (``export.format=NAME``; ``action=export``, kotune/actions/export.py) writes a
saved kotune model as a directory of its own: ``native``, the architecture's transformers class
(kotune/export/native.py), and ``onnx``, an ONNX Runtime directory (kotune/export/onnx.py).

A **runtime** is how a loaded model runs its batches; every model class names its entry in a
``runtime`` attribute: ``torch``, kotune's own model, which transformers' Trainer runs
(kotune/inference/model_runtimes.py), ``onnxruntime``, an ONNX export (kotune/export/onnx.py), and ``transformers``, a native
export behind ``kotune.load`` (kotune/api/native.py). Each registers in the module of its model
class, so a model's runtime is registered by the time the model exists.

This module is light (no torch): the ONNX side and plug-ins import it before anything runs.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

# the export.* options every format shares, read by action=export itself (kotune/actions/export.py)
SHARED_OPTIONS = ("dir", "overwrite", "format", "license", "push_to_hub", "private")


class Exporter:
    """The base class of an export format: its class attributes and two methods are its contract."""

    registered_name: ClassVar[str]  # set by kotune.register_exporter: export.format=NAME
    # the export.* options it reads beyond SHARED_OPTIONS, each with what it does in a few words: an
    # option set (not null) for a format that does not read it is refused in one line, "export.quantize=int8
    # quantizes an ONNX export: add export.format=onnx"
    options: ClassVar[dict[str, str]] = {}
    # the export directory's name in the run directory when export.dir is unset
    default_dir: ClassVar[str] = "export"
    # the Hub's library_name in the model card's front matter (None: the card claims no library)
    library: ClassVar[str | None] = None

    def export(self, model_dir: str, out_dir: str, options: dict[str, Any],
               finish: Callable[[dict, str], Any]) -> dict:
        """Write the saved kotune model ``model_dir`` to ``out_dir`` and return the summary results.json
        keeps of it: a dict of plain values (JSON). kotune sets ``export_dir`` (``out_dir``) and ``format``
        (the registered name) in it; ``native_class``, if given, is the class the log line and the card
        name. ``options``: this format's :attr:`options` as the job set them (None where unset). ``out_dir``
        should appear whole or not at all (kotune/core/atomic_dir.py's ``written_whole``), and
        ``finish(summary, folder)``, which adds the model card (README.md) and sets
        ``summary["model_card"]``, runs on the folder before it does."""
        raise NotImplementedError(f"{type(self).__name__}.export")

    def usage(self, res: dict, out_dir: str) -> str:
        """How to use the export, for the log line ``exported CLASS to DIR: USAGE``."""
        return out_dir

    def card_usage(self, res: dict, out_dir: str) -> list[str]:
        """The model card's "Use" section (markdown lines): by default :meth:`usage` as a code block."""
        return ["```", self.usage(res, out_dir), "```"]


class Runtime:
    """The base class of a runtime: how kotune runs the batches of a model whose ``runtime`` names it."""

    registered_name: ClassVar[str]  # set by kotune.register_runtime
    # the batches run through transformers' Trainer (a torch module with kotune's forward); else a
    # BatchPredictor runs forward(model) (kotune/inference/model_runtimes.py's batch_predictor)
    trainer: ClassVar[bool] = False
    # a kotune model: a checkpoint's saved mode (frozen, layers, pooling, LoRA) is checked against the
    # job's (kotune/loading/build.py); an export is a plain native model, read as it is
    kotune_model: ClassVar[bool] = False
    # what kotune.load's Predictor calls a model of this runtime (describe()["kind"]): kotune, onnx, native
    kind: ClassVar[str] = "export"
    # where and how the batches run (heads/model/inference.py's Inference: predict.device, predict.precision),
    # set by kotune/inference/model_runtimes.py's batch_predictor before forward(model) is asked for; None: the CPU, fp32
    inference: Any = None

    def forward(self, model: Any) -> Callable[[dict], Any]:
        """One padded batch (the collator's tensors) → the logits KotuneModel would give, as numpy (a
        tuple for the span head). The default: the model is that call."""
        return model
