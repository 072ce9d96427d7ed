"""``action=export checkpoint=RUN``: the model as its architecture's native transformers class in
``export.dir`` (default: <run dir>/hf), or with ``export.format=onnx`` as an ONNX Runtime directory
(default: <run dir>/onnx; ``export.quantize=int8`` adds onnxruntime's dynamic int8 model;
heads/onnx.py); a one-line refusal for a head with no exact native equivalent (heads/export.py).
Every export gets a model card (README.md, kotune/model_card.py); ``export.push_to_hub=USER/NAME``
uploads the directory. The directory appears whole or not at all, with ``kotune_manifest.json``
(kotune/core/atomic_dir.py); one that exists and is not empty is refused unless ``export.overwrite=true``."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.checkpoint import checkpoint_model_dir, read_spec
from kotune.model_card import push_to_hub, write_model_card
from kotune.core.errors import ConfigError
from kotune.core.log import log

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
    check_destination(out_dir, model_dir, bool(cfg.export.get("overwrite")))
    saved = read_spec(model_dir)

    def finish(res: dict, folder: str) -> None:  # the card goes in before the export appears whole
        card = write_model_card(res, saved["meta"], saved["head"], str(cfg.checkpoint),
                                str(cfg.export.get("license") or "unknown"), cfg.export.get("push_to_hub"), folder=folder)
        res["model_card"] = os.path.join(out_dir, os.path.basename(card))

    if fmt == "onnx":
        res = export_onnx_directory(model_dir, out_dir, quantize, finish)
        use = f"python run.py action=predict checkpoint={out_dir} (or action=serve)"
    else:
        res = export_directory(model_dir, out_dir, finish)
        use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
               f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
        if res.get("problem_type") == "multi_label_classification":
            use = use[:-1] + ", top_k=None)  (a sigmoid per label; kotune's thresholds: config.kotune_thresholds)"
    log(f"exported {res['native_class']} to {out_dir}: {use}")
    if cfg.export.get("push_to_hub"):
        res["pushed"] = push_to_hub(out_dir, str(cfg.export.push_to_hub), bool(cfg.export.get("private")))
        log(f"pushed {out_dir} to {res['pushed']}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}


def check_destination(out_dir: str, model_dir: str, overwrite: bool) -> None:
    """An export directory that exists and is not empty is refused unless ``export.overwrite=true``
    (the new export then replaces it whole: no file of the old one stays); one that holds the
    checkpoint itself is refused always."""
    if not os.path.lexists(out_dir):
        return
    out, model = os.path.realpath(out_dir), os.path.realpath(model_dir)
    if os.path.commonpath([out, model]) == out:
        raise ConfigError(f"export.dir={out_dir} holds the checkpoint {model_dir}: an export replaces its directory "
                          "whole; choose another export.dir")
    if not os.path.isdir(out_dir):
        raise ConfigError(f"export.dir={out_dir} is a file, not a directory; choose another export.dir")
    if os.listdir(out_dir) and not overwrite:
        raise ConfigError(f"export.dir={out_dir} exists and is not empty: set export.overwrite=true to replace it "
                          "whole (its files are removed), or choose another export.dir")
