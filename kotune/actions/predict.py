"""``action=predict checkpoint=RUN data.predict_file=FILE``: predictions for unlabelled text."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.inference.predict import predict_from_checkpoint
from kotune.core.log import log


def run(cfg: DictConfig, run_dir: str) -> dict:
    res = predict_from_checkpoint(
        cfg, run_dir, "predict", "action=predict needs checkpoint=RUN_DIR and data.predict_file=FILE")
    log(f"wrote {res['n_predict']} predictions to {res['predictions_file']}")
    return res
