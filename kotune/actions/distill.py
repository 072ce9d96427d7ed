"""``action=distill distill.teacher=RUN_OR_EXPORT``: train a small student on a trained model's soft targets
(docs/distillation.md). The student's run is ``action=train``'s (kotune/actions/train.py) with the
teacher's pieces of kotune/distill/distillation.py: the same data, evaluation, checkpoints, resume, selection,
calibration and saved model, so eval, predict, export, serve and sweeps read it as any run."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.actions import train
from kotune.distill.distillation import Distillation
from kotune.devices import cpu_only


def run(cfg: DictConfig, run_dir: str) -> dict:
    import torch

    # on a CPU, denormal floats in a fine-tuned teacher's weights (and the student's copy of them)
    # slow its training by a fifth (bench/distill.py); flushed to zero for this run only
    flushed = cpu_only() and torch.set_flush_denormal(True)
    try:
        return train.run(cfg, run_dir, distillation=Distillation(cfg))
    finally:
        if flushed:
            torch.set_flush_denormal(False)
