"""ONNX Runtime for the heads that have a native transformers class (kotune/export/native.py): the export
(``torch.onnx``'s torch.export-based exporter, dynamic batch and sequence axes), onnxruntime's
dynamic int8 quantization, and :class:`OnnxModel`, which runs an exported directory on padded
batches for ``action=predict`` / ``eval`` / ``serve``.

Why ``torch.onnx`` and not optimum: optimum's ONNX exporter (the ``optimum-onnx`` package) pins
``transformers<4.58``, so it cannot be installed beside transformers 5. ``torch.onnx.export(...,
dynamo=True)`` is torch's default exporter since 2.9 (the TorchScript one is deprecated); it needs
``onnxscript``. It traces the *native* class, so the exported graph is exactly the model that
``transformers.pipeline`` would run (logits equal kotune's: tests/test_onnx.py).

An exported directory holds ``model.onnx`` (fp32), with ``export.quantize=int8`` also
``model_int8.onnx``, the native ``config.json``, the tokenizer, ``kotune_export.json`` (head kind,
labels and task options: what kotune's decoding needs), the model card (README.md) and
``kotune_manifest.json`` (every file's size and sha256, checked when :class:`OnnxModel` loads it).
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable

import numpy as np

from kotune.core.backends import Exporter, Runtime
from kotune.core.atomic_dir import MANIFEST, manifest_lists, settle, verify_manifest, written_whole
from kotune.core.errors import ConfigError, KotuneError
from kotune.core.files import write_json_atomic
from kotune.core.log import quieted
from kotune.core.registry import register_exporter, register_runtime

EXPORT_FILE = "kotune_export.json"
FP32_FILE = "model.onnx"
INT8_FILE = "model_int8.onnx"
QUANTIZE = (None, "int8")
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ONNX_LIMIT = 2 * 1024 ** 3  # protobuf's 2 GB: larger models keep their weights in an external file


def is_onnx_export(path: str) -> bool:
    return os.path.exists(os.path.join(path, EXPORT_FILE))


def _as_outputs(native, names: tuple[str, ...]):
    """The native model's forward as a plain tuple of tensors (the exporter traces no ModelOutput)."""
    from torch import nn

    class Outputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.native = native

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            out = self.native(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return tuple(out[name] for name in names)

    return Outputs().eval()


def trace_to_onnx(native, path: str, input_names: tuple[str, ...], outputs: tuple[str, ...], max_positions: int) -> int:
    """``native`` as an ONNX graph at ``path`` with dynamic batch and sequence axes; returns the opset."""
    import torch

    example = torch.full((2, 8), 5, dtype=torch.long)  # a dynamic axis needs an example of size >= 2
    args = tuple(example if n == "input_ids" else torch.ones_like(example) if n == "attention_mask"
                 else torch.zeros_like(example) for n in input_names)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max_positions)
    big = sum(p.numel() * p.element_size() for p in native.parameters()) > ONNX_LIMIT
    for name in ("torch.onnx", "torch.export", "onnxscript"):  # its progress lines and torchvision notices
        logging.getLogger(name).setLevel(logging.ERROR)
    # onnx_ir's passes note at info level each unused node removed and each initializer deduplicated (22 for a BERT)
    with warnings.catch_warnings(), torch.no_grad(), quieted("onnx_ir"):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_as_outputs(native, outputs), args, path, input_names=list(input_names),
                                    output_names=list(outputs), dynamic_shapes={n: {0: batch, 1: sequence} for n in input_names},
                                    dynamo=True, external_data=big, verbose=False)
    return int(program.model.opset_imports.get("", 0)) if program is not None else 0


def quantize_int8(src: str, dst: str) -> None:
    """onnxruntime's dynamic quantization: int8 weights of every MatMul, activations quantized per
    batch at run time (no calibration data)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # its "consider pre-processing" note
    try:  # the exporter leaves some value types to inference; they are all float tensors
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)


def kotune_graph(model, model_dir: str, inputs: tuple[str, ...]):
    """A head with no native twin (a plug-in's): the kotune model itself as the graph, its outputs named by
    the head's ``onnx_outputs`` (in the order ``forward`` returns them), or one line saying why it cannot be
    one (a head reading inputs besides the text's, outputs that do not match their names)."""
    import torch
    from torch import nn

    head = model.head
    if head.extra_inputs:
        raise ConfigError(f"cannot export {model_dir} to ONNX: the {head.describe()} head has no native transformers "
                          f"class and its forward reads {', '.join(head.extra_inputs)} besides the text, which an "
                          "ONNX graph of the model does not take")
    names = tuple(head.onnx_outputs)

    class Graph(nn.Module):  # the kotune model's logits as the named outputs trace_to_onnx reads
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)["logits"]
            return dict(zip(names, logits if isinstance(logits, tuple) else (logits,)))

    graph = Graph().eval()
    example = torch.full((1, 4), 5, dtype=torch.long)
    with torch.no_grad():
        logits = model.eval()(**{n: example if n == "input_ids" else torch.ones_like(example) if n == "attention_mask"
                                 else torch.zeros_like(example) for n in inputs})["logits"]
    count = len(logits) if isinstance(logits, tuple) else 1
    if count != len(names):
        raise ConfigError(f"cannot export {model_dir} to ONNX: the {head.describe()} head's forward returns {count} "
                          f"output{'s' if count != 1 else ''}, but its onnx_outputs names {len(names)} "
                          f"({', '.join(names)})")
    return graph


def export_onnx_directory(model_dir: str, out_dir: str, quantize: str | None = None,
                          finish: Callable[[dict, str], Any] | None = None) -> dict:
    """An exported directory (module docstring) of the saved kotune model ``model_dir``: the native
    class's graph, or, for a head with no native twin that reads the text alone (a plug-in's), the kotune
    model's own (:func:`kotune_graph`); a head with neither (RE, DP, character-level heads) is refused in
    one line. ``out_dir`` appears whole or not at all, replacing what was there (kotune/core/atomic_dir.py,
    with ``kotune_manifest.json``: no file of an earlier export stays beside the new one);
    ``finish(summary, folder)`` adds files (the model card) before that."""
    from heads.base import NativeHead
    from heads.model.encoder import position_limit
    from heads.model.kotune_model import KotuneModel
    from kotune.core.log import warn
    from kotune.export.native import (export_summary, export_tokenizer, input_fields, input_note, load_native,
                                      merge_adapter)

    if quantize not in QUANTIZE:
        raise ConfigError(f"export.quantize must be null or int8, got '{quantize}'")
    model = KotuneModel.load(model_dir)
    if "kotune_windows" in input_fields(model.meta):  # a document's logits combine its windows' outside the class
        raise ConfigError(f"cannot export {model_dir} to ONNX: it reads documents as windows (task.long_text=windows), "
                          "whose logits kotune combines outside the native class; export.format=native writes it "
                          "with that recipe")
    inputs = tuple(n for n in MODEL_INPUTS if n != "token_type_ids" or model.meta.get("token_type_ids", True))
    if isinstance(model.head.native_export(), NativeHead) or model.head.extra_inputs:
        exported = load_native(model_dir, model)  # or the native path's one-line refusal
        graph, config, tokenizer = exported.native, exported.native.config, exported.tokenizer
        summary = export_summary(exported, out_dir)
    else:
        merged = merge_adapter(model, model_dir)
        graph, config, tokenizer = kotune_graph(model, model_dir, inputs), model.encoder.config, export_tokenizer(model, model_dir)
        note = input_note(model.meta)
        if note:
            warn(note)
        summary = {"export_dir": out_dir, "native_class": None, "graph": "the kotune model (no native transformers class)",
                   "pipeline": None, "num_labels": model.head_kwargs.get("num_labels"), "input_note": note,
                   "lora_merged": merged}
    outputs = model.head.onnx_outputs
    with written_whole(out_dir, "onnx-export") as staging:
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        fp32 = os.path.join(staging, FP32_FILE)
        opset = trace_to_onnx(graph, fp32, inputs, outputs, position_limit(config))
        files = [FP32_FILE]
        if quantize == "int8":
            quantize_int8(fp32, os.path.join(staging, INT8_FILE))
            files.append(INT8_FILE)
        spec = {"format": "onnx", "head": model.head_kind, "meta": model.meta, "inputs": list(inputs),
                "outputs": list(outputs), "files": files, "model_file": files[-1], "opset": opset,
                "exporter": "torch.onnx (dynamo)", "native_class": summary["native_class"] or type(model).__name__,
                "manifest": MANIFEST}
        write_json_atomic(os.path.join(staging, EXPORT_FILE), spec)
        sizes = {f: round(os.path.getsize(os.path.join(staging, f)) / 1e6, 1) for f in files}
        res = {**summary, "format": "onnx", "onnx_files": files,
               "onnx_mb": sizes, "model_file": spec["model_file"], "opset": opset}
        if finish is not None:
            finish(res, staging)
    return res


@register_exporter("onnx")
class OnnxExporter(Exporter):
    """``export.format=onnx``: :func:`export_onnx_directory`, run by :class:`OnnxModel`."""

    options = {"quantize": "quantizes an ONNX export"}
    default_dir = "onnx"
    library = "onnx"

    def export(self, model_dir: str, out_dir: str, options: dict, finish: Callable[[dict, str], Any]) -> dict:
        return export_onnx_directory(model_dir, out_dir, options.get("quantize"), finish)

    def usage(self, res: dict, out_dir: str) -> str:
        return f"python run.py action=predict checkpoint={out_dir} (or action=serve)"

    def card_usage(self, res: dict, out_dir: str) -> list[str]:
        from kotune.export.model_card import onnx_usage

        return onnx_usage(res)


@register_runtime("onnxruntime")
class OnnxRuntime(Runtime):
    """:class:`OnnxModel`: a padded batch in, the logits out (it is its own forward)."""

    kind = "onnx"

    def forward(self, model: Any) -> Any:
        model.run_on(self.inference)
        return model


class OnnxModel:
    """An exported directory run by onnxruntime, standing in for a KotuneModel where kotune only
    predicts: ``head_kind`` and ``meta`` as saved, and a call that turns one padded batch (the
    collator's tensors) into the logits KotuneModel would give (a tuple for the span head)."""

    runtime = "onnxruntime"
    frozen = False

    def __init__(self, directory: str, file: str | None = None, threads: int | None = None, spec: dict | None = None):
        """``spec``: its kotune_export.json as already read and checked (kotune/loading/checkpoint.py
        reads a checkpoint's once), else read and checked here."""
        import onnxruntime as ort

        settle(directory)  # an export killed while swapping its directory in: put the whole one back
        from heads.model.artifact import ArtifactError, check_export_spec, check_files, check_outputs, parse

        where = os.path.join(directory, EXPORT_FILE)
        if spec is None:
            check_files(directory, directory)  # before any file is opened: a link out of the export is refused
            with open(where, encoding="utf-8") as f:
                spec = check_export_spec(parse(f.read(), where), where)  # data only: heads/model/artifact.py
        # exported with a manifest (kotune_export.json says so): every file as it was written
        verify_manifest(directory, bool(spec.get("manifest")), "export it again (action=export)")
        from heads.registry import resolve

        self.spec, self.meta = spec, spec["meta"]
        self.head_kind = resolve(spec["head"], {})[0]  # only heads without options export (pair: sequence)
        self.file = str(file or spec["model_file"])
        path = os.path.join(directory, self.file)
        # a model file of this export: listed in its spec (and manifest), not one an earlier export left
        if self.file not in spec["files"] or manifest_lists(directory, self.file) is False or not os.path.isfile(path):
            raise KotuneError(f"onnx.file={self.file}: not a model file of the export {directory} (its files: "
                              f"{', '.join(spec['files'])})")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or default_threads())
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.threads = options.intra_op_num_threads
        self.path, self.options = path, options
        try:
            self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's own error types: the file's fault, not kotune's
            raise ArtifactError(f"{path}: not an ONNX graph onnxruntime runs ({str(e).splitlines()[0]})") from None
        check_outputs(self.meta, self.session.get_outputs(), self.file, where)  # its logits, one per label
        self.provider = "CPUExecutionProvider"  # until run_on(predict.device)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run_on(self, inference: Any) -> None:
        """Run on ``inference``'s device (predict.device): kotune/inference/model_runtimes.py's :func:`onnx_run_on`."""
        from kotune.inference.model_runtimes import onnx_run_on

        onnx_run_on(self, inference)

    def __call__(self, batch: dict) -> Any:
        feed = {n: np.asarray(batch[n], dtype=np.int64) for n in self.input_names}
        out = tuple(self.session.run(None, feed))
        return out if len(out) > 1 else out[0]

    def report(self) -> dict:
        return {"layers": "last", "pooling": "cls" if self.head_kind == "sequence" else None,
                "onnx_file": self.file}

    def head_description(self) -> str:
        return self.head_kind  # an export's head has no options (kotune/export/native.py refuses those that do)

    def describe(self) -> str:
        return f"onnxruntime: {self.file} ({self.threads} threads, {self.provider})"


def default_threads() -> int:
    import torch

    return torch.get_num_threads()
