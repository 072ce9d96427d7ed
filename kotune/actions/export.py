"""``action=export checkpoint=RUN``: the model as its architecture's native transformers class in
``export.dir`` (default: <run dir>/hf), or with ``export.format=onnx`` as an ONNX Runtime directory
(default: <run dir>/onnx; ``export.quantize=int8`` adds onnxruntime's dynamic int8 model;
heads/onnx.py); a one-line refusal for a head with no exact native equivalent (heads/export.py).
Every export gets a model card (README.md, kotune/model_card.py); ``export.push_to_hub=USER/NAME``
uploads the directory."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.checkpoint import checkpoint_model_dir, read_spec
from kotune.model_card import push_to_hub, write_model_card
from tasks.errors import ConfigError
from tasks.log import log

FORMATS = ("native", "onnx")


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.export import export_directory
    from heads.onnx import export_onnx_directory

    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    fmt, quantize = str(cfg.export.get("format") or "native"), cfg.export.get("quantize")
    if fmt not in FORMATS:
        raise ConfigError(f"export.format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    if quantize is not None and fmt != "onnx":
        raise ConfigError(f"export.quantize={quantize} quantizes an ONNX export: add export.format=onnx")
    model_dir = checkpoint_model_dir(cfg.checkpoint)
    out_dir = str(cfg.export.get("dir") or os.path.join(run_dir, "onnx" if fmt == "onnx" else "hf"))
    if fmt == "onnx":
        res = export_onnx_directory(model_dir, out_dir, quantize)
        use = f"python run.py action=predict checkpoint={out_dir} (or action=serve)"
    else:
        res = export_directory(model_dir, out_dir)
        use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
               f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
        if res.get("problem_type") == "multi_label_classification":
            use = use[:-1] + ", top_k=None)  (a sigmoid per label; kotune's thresholds: config.kotune_thresholds)"
    saved = read_spec(model_dir)
    res["model_card"] = write_model_card(res, saved["meta"], saved["head"], str(cfg.checkpoint),
                                         str(cfg.export.get("license") or "unknown"), cfg.export.get("push_to_hub"))
    log(f"exported {res['native_class']} to {out_dir}: {use}")
    if cfg.export.get("push_to_hub"):
        res["pushed"] = push_to_hub(out_dir, str(cfg.export.push_to_hub), bool(cfg.export.get("private")))
        log(f"pushed {out_dir} to {res['pushed']}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}
