"""``action=export export.format=onnx`` of a bi-encoder checkpoint (``export.quantize=int8`` adds the
dynamically quantized model): encoder, layer choice and pooling traced as one graph with
kotune/export/onnx.py's exporter and quantizer; inputs ``input_ids``, ``attention_mask``[, ``token_type_ids``],
output ``sentence_embedding``; the directory is an ONNX export as kotune/export/onnx.py describes it
(``kotune_export.json`` with head ``bi_encoder``) and appears whole or not at all."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.core.errors import ConfigError


def onnx_graph(model):
    """Encoder, layer choice and pooling as one module: (ids, mask[, token types]) → sentence_embedding."""
    import torch

    class Embedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            states = self.model.encode(input_ids, attention_mask, token_type_ids)
            return {"sentence_embedding": self.model.head(states, attention_mask)}

    return Embedding().eval()


def export_onnx(cfg: DictConfig, run_dir: str) -> dict:
    """The export (module docstring), where kotune/cli/job.py hands action=export export.format=onnx of a bi-encoder."""
    from heads.model.encoder import position_limit
    from kotune.actions.export import check_destination
    from kotune.loading.checkpoint import checkpoint_model_dir
    from kotune.core.atomic_dir import MANIFEST, written_whole
    from kotune.core.files import write_json_atomic
    from kotune.embeddings.export import load_bi_encoder
    from kotune.export.onnx import EXPORT_FILE, FP32_FILE, INT8_FILE, MODEL_INPUTS, QUANTIZE, quantize_int8, trace_to_onnx

    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    quantize = cfg.export.get("quantize")
    if quantize not in QUANTIZE:
        raise ConfigError(f"export.quantize must be null or int8, got '{quantize}'")
    model_dir = checkpoint_model_dir(str(cfg.checkpoint))
    out_dir = str(cfg.export.get("dir") or os.path.join(run_dir, "onnx"))
    check_destination(out_dir, model_dir, bool(cfg.export.get("overwrite")))
    model, tokenizer = load_bi_encoder(model_dir)
    inputs = tuple(n for n in MODEL_INPUTS if n != "token_type_ids" or model.meta.get("token_type_ids", True))
    with written_whole(out_dir, "onnx-export") as staging:
        model.encoder.config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        opset = trace_to_onnx(onnx_graph(model), os.path.join(staging, FP32_FILE), inputs, ("sentence_embedding",),
                              position_limit(model.encoder.config))
        files = [FP32_FILE]
        if quantize == "int8":
            quantize_int8(os.path.join(staging, FP32_FILE), os.path.join(staging, INT8_FILE))
            files.append(INT8_FILE)
        spec = {"format": "onnx", "head": model.head_kind, "meta": model.meta, "inputs": list(inputs),
                "outputs": ["sentence_embedding"], "files": files, "model_file": files[-1], "opset": opset,
                "exporter": "torch.onnx (dynamo)", "native_class": "BiEncoderGraph", "manifest": MANIFEST}
        write_json_atomic(os.path.join(staging, EXPORT_FILE), spec)
    return {"export_dir": out_dir, "format": "onnx", "onnx_files": files, "model_file": files[-1], "opset": opset,
            "native_class": spec["native_class"], "checkpoint": cfg.checkpoint, "metrics": {}}
