"""bench/throughput.py's runner: one timed phase (training steps, or prediction with decoding) of
either pipeline on the same rows: kotune's trainer and ``predict`` against the fixed-padding recipe
(plain Trainer, random batches, ``default_data_collator``); what it took (seconds, FLOPs of the
processed shapes, peak memory, padding efficiency) and how far the two pipelines' predictions agree."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import Trainer, TrainerCallback, default_data_collator

from bench.common import PeakMemory, matmul_peak, sync, timed
from bench.throughput_data import PEAK, Bench, efficiency
from kotune.inference.predict import predict
from kotune.training.arguments import training_arguments
from kotune.training.trainer import make_trainer


class TrainTimer(TrainerCallback):
    """Wall time of ``Trainer.train``'s loop: the steps, their batches and the optimizer, not
    building the Trainer."""

    seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        sync()
        self.start = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        sync()
        self.seconds = time.perf_counter() - self.start


class CapturedPredictions:
    """``with CapturedPredictions(task) as seen: predict(...)``: ``seen.raw`` holds what
    ``predict`` handed to ``task.decode`` (predictions back in the rows' order)."""

    def __init__(self, task):
        self.task, self.raw = task, None

    def __enter__(self) -> "CapturedPredictions":
        decode = self.decode = self.task.decode

        def capture(predictions, features, examples):
            self.raw = predictions
            return decode(predictions, features, examples)

        self.task.decode = capture
        return self

    def __exit__(self, *exc) -> None:
        self.task.decode = self.decode


def recipe_trainer(bench: Bench, train_rows, steps: int, workdir: str, seed: int, batch: int,
                   sampling: str = "random"):
    """The fixed-padding recipe: plain Trainer, random batches, rows padded to max_length. Same
    TrainingArguments as kotune's otherwise (learning rate, precision, seed, workers)."""
    args = training_arguments(bench.cfg, workdir, list(bench.built.task.label_fields), do_eval=False)
    args = dataclasses.replace(args, train_sampling_strategy=sampling, max_steps=steps,
                               per_device_train_batch_size=batch, seed=seed, disable_tqdm=True)
    data = bench.padded.select(train_rows) if train_rows is not None else None
    return Trainer(model=bench.model, args=args, train_dataset=data, data_collator=default_data_collator)


def kotune_trainer(bench: Bench, b, steps: int, workdir: str, seed: int, batch: int, replay: bool):
    """kotune's trainer on ``b``; ``replay``: feed its training rows in the given order (batches
    already drawn from kotune's length-grouped epoch) instead of drawing them again."""
    cfg = with_overrides(bench.cfg, [f"train.max_steps={steps}", f"train.seed={seed}", f"train.batch_size={batch}"])
    trainer = make_trainer(cfg, b, workdir)
    trainer.args.disable_tqdm = True
    if replay:
        trainer.args.train_sampling_strategy = "sequential"
    return trainer


def with_overrides(cfg, overrides: list[str]):
    return OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)),
                           OmegaConf.from_dotlist(overrides))


def run_train(bench: Bench, pipeline: str, batches: list[list[int]], workdir: str, seed: int) -> dict:
    rows = [i for b in batches for i in b]
    bench.reset()
    if pipeline == "kotune":
        trainer = kotune_trainer(bench, bench.subset(rows, "train"), len(batches), workdir, seed,
                                 bench.spec["batch"], replay=True)
        shapes = [(len(b), bench.padded_len(b)) for b in batches]
    else:
        trainer = recipe_trainer(bench, rows, len(batches), workdir, seed, bench.spec["batch"])
        shapes = [(len(b), bench.spec["max_length"]) for b in batches]
    timer = TrainTimer()
    trainer.add_callback(timer)
    with PeakMemory() as mem:
        trainer.train()
    flops = sum(bench.flops(n, t, train=True) for n, t in shapes)
    return {"s": timer.seconds, "samples": len(rows), "flops": flops, "mem": mem.peak_bytes,
            "efficiency": efficiency(bench, batches, fixed=pipeline == "recipe")}


def run_eval(bench: Bench, pipeline: str, batches: list[list[int]], workdir: str) -> dict:
    """Time prediction on the initial weights; also return the decoded outputs and the raw
    predictions each row got (in the rows' order), to compare the two pipelines. Both timings
    include decoding."""
    rows = [i for b in batches for i in b]
    bench.reset()
    task = bench.built.task
    if pipeline == "kotune":
        b = bench.subset(rows, "validation")
        trainer = kotune_trainer(bench, b, 1, workdir, 0, bench.spec["batch"], replay=False)
        with CapturedPredictions(task) as seen, PeakMemory() as mem, timed() as t:
            outputs, _ = predict(trainer, b, "validation")
        raw = seen.raw
        shapes = [(len(x), bench.padded_len(x)) for x in batches]
    else:
        trainer = recipe_trainer(bench, None, 1, workdir, 0, bench.spec["batch"])
        with PeakMemory() as mem, timed() as t:
            raw = trainer.predict(bench.padded.select(rows)).predictions
            outputs = task.decode(raw, bench.features.select(rows), [bench.examples[i] for i in rows])
        shapes = [(len(x), bench.spec["max_length"]) for x in batches]
    flops = sum(bench.flops(n, length, train=False) for n, length in shapes)
    return {"s": t["s"], "samples": len(rows), "flops": flops, "mem": mem.peak_bytes, "outputs": outputs,
            "raw": raw, "rows": rows, "efficiency": efficiency(bench, batches, fixed=pipeline == "recipe")}


def max_logit_gap(bench: Bench, a: dict, b: dict) -> float:
    """Largest difference between the two pipelines' predictions for the same row (token
    predictions compared on the row's own tokens only); the shorter run's rows are a prefix of the
    other's."""
    gap = 0.0
    for i, row in enumerate(min(a["rows"], b["rows"], key=len)):
        x, y = np.asarray(a["raw"][i]), np.asarray(b["raw"][i])
        if x.ndim > 1:
            n = int(bench.lengths[row])
            x, y = x[:n], y[:n]
        gap = max(gap, float(np.abs(x - y).max()))
    return gap


def quick_peak(dtype: torch.dtype) -> float:
    """The matmul rate right now (one FFN-shaped GEMM, ~0.3 s): on a CPU shared with other jobs
    the rate a phase could get moves with their load, so each phase's MFU is taken against the
    mean of the rates measured just before and just after it."""
    return matmul_peak(dtype, **{"repeats": 3, "budget_s": 1.0, "shapes": ((4096, 768, 3072),), **PEAK})


def agreement(a: list, b: list) -> float:
    """Share of rows with the same decoded output (over the shorter list: a prefix of the other)."""
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])) / max(1, n)

