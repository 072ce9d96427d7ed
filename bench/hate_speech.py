"""What the hate-speech fine-tuning benches share (bench/class_weights.py, bench/multi_label.py): the
encoder (kotune's random tiny one or the pretrained mini encoder of bench/pretrain_gain.py), the
options, the data folder of ``--shared``, the learning rate chosen on a seeded held-out slice of the
training file, and the --smoke settings."""
from __future__ import annotations

import argparse
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --smoke (every fine-tuning bench on hate speech here): 2 steps on the first rows, two seeds, one rate
SMOKE = dict(steps=2, batch=8, max_length=32, lrs="1e-3", seeds="1,2")
SMOKE_DATA = ["data.max_train_samples=160", "data.max_eval_samples=64"]


def model_overrides(model: str, model_dir: str | None, cache_dir: str) -> list[str]:
    """The encoder: kotune's tiny (random, its own tokenizer) or a pretrained local directory."""
    if model == "tiny":
        return ["model=tiny", f"cache_dir={cache_dir}"]
    if not model_dir:
        raise SystemExit("--model-dir DIR is needed (the mini encoder: python -m bench.pretrain_gain --only-pretrain)")
    return ["model=klue", "model.name=mini-pretrained", f"model.name_or_path={model_dir}", "model.init=pretrained",
            f"cache_dir={cache_dir}"]


def select_lr(run, lrs: list[float], metric: str) -> tuple[float, dict[float, float]]:
    """The learning rate with the best ``metric`` on the seeded held-out slice of the training file:
    ``run(lr, seed, select=True)`` returns that job's results (seed 1)."""
    grid = {lr: run(lr, 1, select=True)["metrics"][metric] for lr in lrs}
    return max(grid, key=grid.get), grid


def evaluation(dev: str, select: bool, select_split: float) -> list[str]:
    """The evaluation side of a run: ``dev`` or, to select, a seeded ``select_split`` of the training file."""
    return [f"data.validation_split={select_split}"] if select else [f"data.validation_file={dev}"]


def fine_tuning_options(p: argparse.ArgumentParser, seeds: str, out: str) -> None:
    """The options every hate-speech fine-tuning bench here shares."""
    p.add_argument("--model-dir", help="the pretrained mini encoder's directory (bench/pretrain_gain.py's model/)")
    p.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"), help="the ../shared folder")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lrs", default="3e-4,1e-3", help="learning-rate grid, picked per arm on --select-split")
    p.add_argument("--select-split", type=float, default=0.15)
    p.add_argument("--seeds", default=seeds)
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), out))


def hate_speech(a) -> str:
    """The hate-speech folder of ``--shared`` (exits with the reason where it is absent)."""
    data = os.path.join(a.shared, "data", "hate-speech")
    if not os.path.exists(os.path.join(data, "train.tsv")):
        raise SystemExit(f"skipped: {data}/train.tsv not found (../shared absent: --shared DIR)")
    return data


def training_overrides(a, model: str, lr: float, seed: int) -> list[str]:
    """Encoder and optimisation of one fine-tuning run."""
    return [*model_overrides(model, a.model_dir, a.cache_dir), f"train.learning_rate={lr}", f"train.seed={seed}",
            f"train.max_steps={a.steps}", f"train.batch_size={a.batch}", f"train.max_length={a.max_length}",
            "train.warmup_ratio=0.1", "save_model=false", *(SMOKE_DATA if getattr(a, "smoke", False) else [])]
