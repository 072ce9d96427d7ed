"""Frozen mode: epoch time with the feature cache vs recomputing the encoder every epoch.

Same data (../shared KLUE NLI dev, a seeded split into train/eval subsets), the same random-init
encoder of base size (config and vocabulary of ../shared/vocab/kcbert-base), the same head and
seed; both runs go through kotune's own ``build`` → ``make_trainer`` → ``predict``. Prints the
epoch times of both paths, the one-time encoding cost, the metrics of both, and ends with

    RESULT frozen_cache_speedup=<x> metric_delta=<d>

(speedup: mean recompute epoch / mean cached epoch; delta: the largest absolute difference of the
two paths' metrics, in points). Base size on a few CPU cores is slow: ``--train``/``--eval`` pick
the subset sizes (the default run takes a few minutes on 2 cores).

    python -m bench.frozen_cache [--train 128] [--eval 48] [--epochs 2] [--layers last]
    python -m bench.frozen_cache --smoke   # all three runs on a 1-layer × 32 encoder, 16 / 8 pairs
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


# --smoke: the encoder shrunk (the kcbert-base vocabulary kept), appended to every run
SMOKE_ENCODER = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
                 "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]


def overrides(args, cache: bool, cache_dir: str) -> list[str]:
    return [
        "task=nli", "model=kcbert", "model.init=random", f"model.name_or_path={SHARED / 'vocab/kcbert-base'}",
        "mode=frozen", f"mode.cache={str(cache).lower()}", f"mode.layers={args.layers}",
        f"mode.cache_dtype={args.cache_dtype}",
        f"data.train_file={SHARED / 'data/klue/klue-nli-v1.1_dev.json'}", "data.validation_split=0.2",
        f"data.max_train_samples={args.train}", f"data.max_eval_samples={args.eval}",
        f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}", f"train.eval_batch_size={args.batch_size}",
        f"train.learning_rate={args.lr}", f"train.max_length={args.max_length}", "train.logging_steps=100000",
        f"cache_dir={cache_dir}", "save_model=false", "save_predictions=false",
        *(SMOKE_ENCODER if getattr(args, "smoke", False) else []),
    ]


def run_path(args, cache: bool, cache_dir: str, run_dir: str) -> dict:
    """One frozen training run through kotune's pieces, timing each epoch with a callback."""
    from transformers import TrainerCallback

    from kotune.loading.build import build
    from kotune.cli.overrides import compose
    from kotune.inference.predict import predict
    from kotune.training.trainer import make_trainer

    cfg = compose(overrides(args, cache, cache_dir))
    epochs: list[float] = []

    class EpochTimer(TrainerCallback):
        def on_epoch_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_epoch_end(self, *_, **__):
            epochs.append(time.perf_counter() - self.started)

    started = time.perf_counter()
    b = build(cfg, ("train", "validation"))
    build_s = time.perf_counter() - started
    trainer = make_trainer(cfg, b, run_dir)
    trainer.add_callback(EpochTimer())
    trainer.train()
    started = time.perf_counter()
    outputs, _ = predict(trainer, b, "validation")
    eval_s = time.perf_counter() - started
    metrics = b.task.score(outputs, b.splits["validation"].examples)
    return {"epochs": epochs, "build_s": build_s, "eval_s": eval_s, "metrics": metrics, "outputs": outputs,
            "cache": b.cache_report, "n_train": len(b.splits["train"].examples),
            "n_eval": len(b.splits["validation"].examples), "tokens": sum(len(x) for x in b.features["train"]["input_ids"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=128, help="training pairs (of the 2,400 not held out)")
    parser.add_argument("--eval", type=int, default=48, help="evaluation pairs (of the 600 held out)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3, help="head learning rate")
    parser.add_argument("--layers", default="last", help="mode.layers (scalar_mix caches all 13 states)")
    parser.add_argument("--cache-dtype", default="float16")
    parser.add_argument("--cache-dir", default=None, help="default: a fresh temporary directory")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"train": 16, "eval": 8, "batch_size": 8, "max_length": 32})
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the cached path's epochs after the first are the point)")
    for need in (SHARED / "data/klue/klue-nli-v1.1_dev.json", SHARED / "vocab/kcbert-base/config.json"):
        if not need.exists():
            print(f"SKIP: ../shared absent ({need} not found)")
            return

    import torch

    from kotune.devices import quiet_libraries

    quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("KOTUNE_PROGRESS", "0")
    work = Path(tempfile.mkdtemp(prefix="kotune_frozen_bench_"))
    cache_dir = args.cache_dir or str(work / "cache")
    print(f"# frozen cache benchmark: KLUE NLI dev, kcbert-base shape (random init), {args.train} train / "
          f"{args.eval} eval pairs, {args.epochs} epochs, batch {args.batch_size}, layers={args.layers}, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)

    try:
        recompute = run_path(args, False, cache_dir, str(work / "recompute"))
        cached = run_path(args, True, cache_dir, str(work / "cached"))
        again = run_path(args, True, cache_dir, str(work / "again"))  # a second run: the cache is reused
    finally:
        shutil.rmtree(work, ignore_errors=True)  # run dirs, and the cache unless --cache-dir was given

    slow = sum(recompute["epochs"]) / len(recompute["epochs"])
    fast = sum(cached["epochs"]) / len(cached["epochs"])
    encode_train = cached["cache"]["splits"]["train"]["seconds"]
    speedup = slow / fast
    delta = max(abs(recompute["metrics"][k] - cached["metrics"][k]) for k in recompute["metrics"])
    agree = sum(a == b for a, b in zip(recompute["outputs"], cached["outputs"])) / len(cached["outputs"])
    print(json.dumps({
        "n_train": recompute["n_train"], "n_eval": recompute["n_eval"], "train_tokens": recompute["tokens"],
        "recompute_epoch_s": [round(s, 2) for s in recompute["epochs"]],
        "cached_epoch_s": [round(s, 3) for s in cached["epochs"]],
        "cache_encode_s": {s: v["seconds"] for s, v in cached["cache"]["splits"].items()},
        "cache_mb": round(cached["cache"]["bytes"] / 1e6, 1),
        "first_epoch_speedup_incl_encoding": round(slow / (encode_train + cached["epochs"][0]), 2),
        "eval_s": {"recompute": round(recompute["eval_s"], 2), "cached": round(cached["eval_s"], 3)},
        "second_run_cache": again["cache"]["status"], "second_run_setup_s": round(again["build_s"], 2),
        "metrics": {"recompute": recompute["metrics"], "cached": cached["metrics"],
                    "second_run": again["metrics"]},
        "prediction_agreement": agree}, indent=2), flush=True)
    print(f"RESULT frozen_cache_speedup={speedup:.1f} metric_delta={delta:.4f}", flush=True)


if __name__ == "__main__":
    main()
