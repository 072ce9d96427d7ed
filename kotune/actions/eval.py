"""``action=eval checkpoint=RUN``: reload a trained model and score the validation split."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.predict import predict_from_checkpoint


def run(cfg: DictConfig, run_dir: str) -> dict:
    return predict_from_checkpoint(
        cfg, run_dir, "validation", "action=eval needs checkpoint=RUN_DIR (a directory written by action=train)")
