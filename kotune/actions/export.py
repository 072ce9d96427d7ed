"""``action=export checkpoint=RUN``: the model as its architecture's native transformers class in
``export.dir`` (default: <run dir>/hf), or a one-line refusal for a head with no exact native
equivalent (heads/export.py)."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.checkpoint import checkpoint_model_dir
from tasks.errors import ConfigError
from tasks.log import log


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.export import export_directory

    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    out_dir = str(cfg.export.get("dir") or os.path.join(run_dir, "hf"))
    res = export_directory(checkpoint_model_dir(cfg.checkpoint), out_dir)
    use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
           f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
    if res.get("problem_type") == "multi_label_classification":
        use = use[:-1] + ", top_k=None)  (a sigmoid per label; kotune's thresholds: config.kotune_thresholds)"
    log(f"exported {res['native_class']} to {out_dir}: {use}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}
