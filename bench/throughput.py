"""Throughput of kotune's pipeline against the fixed-padding recipe, on one machine, in one run.

    python -m bench.throughput            # base-size encoder (< 10 min on 2 CPU cores)
    python -m bench.throughput --small    # 2-layer encoder, quick (< 2 min)
    python -m bench.throughput --smoke    # every phase on a 1-layer × 32 encoder and 128 rows per task

Both pipelines train and evaluate the *same* encoder (BERT-base shape from
../shared/vocab/kcbert-base/config.json with 512 positions, random init, same seed), on the same
KLUE dev files from ../shared (NLI at max_length 128, NER at 510), through ``transformers.Trainer``:

* kotune: kotune's own build (tokenize once, cached), collator (dynamic padding), length-grouped
  training batches, length-sorted prediction with the order restored (``kotune.inference.predict.predict``).
* recipe (KLUE-baseline / KoELECTRA fine-tuning code): every row padded to max_length, random
  batches, plain ``Trainer`` and ``default_data_collator``.

A full epoch of base-size training does not fit the time budget, so the timed training steps are
K batches of a real epoch: kotune's length-grouped sampler is run over the whole split and K of its
batches are taken at evenly spaced quantiles of their padded length (the epoch's length profile).
Evaluation likewise times K batches of the split's sorted order. The recipe's cost per row does not
depend on the row (every row is max_length long), so it times the first ``--recipe-batches`` of
those batches (the same examples, in random batches for training). The two pipelines alternate for
``--rounds`` rounds (which goes first alternates too); the report gives medians and their ratio.

Also reported: padding efficiency (real tokens / processed tokens) of the timed steps and of a
whole epoch, peak memory each phase adds (CPU: resident set above the phase's start), and MFU:
model FLOPs of the processed (padded) shapes per second over the plain-matmul rate measured in this
process on the model's FFN GEMM shape just before and just after the phase (on a CPU shared with
other jobs the rate available moves with their load); MFU* divides by the best rate seen in the run
(any of the model's GEMM shapes), the hardware's peak when the machine was idle at some point.

Same science: (1) on the same weights both pipelines predict the same, example by example;
(2) padding is inert: a small encoder (dropout off) trained on kotune's batches, padded by kotune
and padded to max_length, takes the same steps (losses, then held-out logits, agree to float
rounding); (3) a small encoder trained by each pipeline with its own sampler on the same examples
for the same steps, two seeds each: held-out metric and loss, pipeline gap vs seed noise (t-test).

The last line: ``RESULT nli_train_speedup=<x> ner_train_speedup=<y> padding_efficiency=<p> mfu=<m>``
(kotune's NLI training: padding efficiency over a whole epoch, MFU of the timed steps; the base-size
run's MFU is the one that counts, a 2-layer encoder is too small to keep the matmuls busy).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# Idle OpenMP threads sleep instead of spinning. On a CPU shared with other jobs, spinning threads
# that lose their core stall every parallel region (measured here: 20x slower steps for a small
# encoder, and wildly varying); on an idle machine it costs a few percent. Set before torch loads
# its OpenMP runtime; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import Trainer, TrainerCallback, default_data_collator  # noqa: E402
from transformers.trainer_pt_utils import LengthGroupedSampler  # noqa: E402

from bench.common import PeakMemory, matmul_peak, median, sync, timed  # noqa: E402
from kotune.loading.build import build
from kotune.loading.built import Built  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402
from kotune.inference.predict import predict  # noqa: E402
from kotune.devices import pad_multiple, quiet_libraries  # noqa: E402
from kotune.training.trainer import make_trainer  # noqa: E402
from kotune.training.arguments import training_arguments  # noqa: E402
from tasks.splits import Split  # noqa: E402
from tasks.collate import length_order  # noqa: E402

TASKS = {
    "nli": {"file": "data/klue/klue-nli-v1.1_dev.json", "max_length": 128, "batch": 32, "eval_batch": 64,
            "per_token": False},
    "ner": {"file": "data/klue/klue-ner-v1.1_dev.tsv", "max_length": 510, "batch": 8, "eval_batch": 16,
            "per_token": True},
}
ENCODER = ["model=kcbert", "model.init=random", f"model.name_or_path={SHARED / 'vocab' / 'kcbert-base'}",
           "model.config_overrides.max_position_embeddings=512"]  # NER's 510 tokens need 512 positions
SMALL = ["model.config_overrides.num_hidden_layers=2", "model.config_overrides.hidden_size=256",
         "model.config_overrides.num_attention_heads=4", "model.config_overrides.intermediate_size=1024"]
# same-science check: one epoch over `train` examples, `eval` held out (NER's is opt-in: its recipe
# trains at 510 tokens)
QUALITY = {"nli": {"train": 768, "eval": 480, "steps": 24, "batch": 32},
           "ner": {"train": 400, "eval": 300, "steps": 50, "batch": 8}}
# --smoke: the small encoder shrunk again, the first rows of each split, the same-science check at 2 steps,
# the matmul rate on one small shape
SMOKE_SMALL = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
               "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]
SMOKE_DATA = ["data.max_train_samples=128", "data.max_eval_samples=128"]
SMOKE_QUALITY = {"nli": {"train": 64, "eval": 32, "steps": 2, "batch": 8},
                 "ner": {"train": 64, "eval": 32, "steps": 2, "batch": 8}}
SMOKE_PEAK = {"repeats": 1, "budget_s": 0.1, "shapes": ((256, 256, 256),)}
EXTRA: list[str] = []  # SMOKE_DATA under --smoke
PEAK: dict = {}  # SMOKE_PEAK under --smoke


STARTED = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench {time.perf_counter() - STARTED:5.0f}s] {msg}", flush=True)


# ---- data -------------------------------------------------------------------------------------
class Bench:
    """One task: kotune's build of the whole dev split (as train and as validation), its initial
    weights, and the same rows padded to max_length for the recipe."""

    def __init__(self, name: str, args, workdir: str, small: bool = False, extra: tuple = ()):
        spec = TASKS[name]
        self.name, self.spec = name, spec
        path = SHARED / spec["file"]
        self.cfg = compose([f"task={name}", *ENCODER, *(SMALL if small else []), f"data.train_file={path}",
                            f"data.validation_file={path}", f"train.max_length={spec['max_length']}",
                            f"train.batch_size={spec['batch']}", f"train.eval_batch_size={spec['eval_batch']}",
                            f"train.precision={args.precision}", "train.warmup_ratio=0", "train.logging_steps=1000",
                            "save_model=false", f"cache_dir={workdir}/cache", *EXTRA, *extra])
        self.built = build(self.cfg, ("train", "validation"))
        self.model = self.built.model
        self.init_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.features = self.built.features["validation"]
        self.examples = self.built.splits["validation"].examples
        self.lengths = np.array([len(ids) for ids in self.features["input_ids"]])
        self.multiple = pad_multiple(self.cfg.train)
        self.padded = pad_to_max(self.built.inputs["validation"], self.built.tokenizer.pad_token_id,
                                 spec["max_length"])
        enc = self.model.encoder
        self.layers, self.hidden = int(enc.config.num_hidden_layers), int(enc.config.hidden_size)
        self.layer_params = sum(p.numel() for n, p in enc.named_parameters() if ".layer." in f".{n}")
        self.head_params = sum(p.numel() for p in self.model.head.parameters())

    def reset(self) -> None:
        self.model.load_state_dict(self.init_state)

    def padded_len(self, rows) -> int:
        longest = int(self.lengths[rows].max())
        return -(-longest // self.multiple) * self.multiple

    def flops(self, rows_per_batch: int, length: int, train: bool) -> float:
        """Forward FLOPs of one batch of this padded shape (×3 for forward + backward)."""
        per_token_params = self.layer_params + (self.head_params if self.spec["per_token"] else 0)
        dense = 2 * per_token_params * length + (0 if self.spec["per_token"] else 2 * self.head_params)
        attention = 4 * self.layers * length * length * self.hidden  # QK^T and AV
        return (3 if train else 1) * rows_per_batch * (dense + attention)

    def subset(self, rows: list[int], split: str):
        """A Built over just these rows (kotune's pipeline on a slice of the split)."""
        feats = self.features.select(rows)
        exs = [self.examples[i] for i in rows]
        b = Built(self.built.task, {split: Split(exs, {})}, self.built.tokenizer, self.model,
                      {split: feats}, self.built.max_length)
        if split == "train":  # make_trainer wants a validation split to exist
            b.features["validation"], b.splits["validation"] = feats, Split(exs, {})
            b.inputs["validation"] = b.inputs["train"]
        return b


def pad_to_max(inputs, pad_id: int, max_length: int):
    """The recipe's features: every sequence column padded to max_length (labels with -100)."""
    def pad(batch):
        out = {}
        for key, values in batch.items():
            if values and isinstance(values[0], list):
                fill = pad_id if key == "input_ids" else 0 if key in ("attention_mask", "token_type_ids") else -100
                out[key] = [v + [fill] * (max_length - len(v)) for v in values]
            else:
                out[key] = values
        return out

    return inputs.map(pad, batched=True, desc="padding to max_length")


def epoch_batches(bench: Bench, seed: int) -> list[list[int]]:
    """The batches of one training epoch of kotune's length-grouped sampler over the whole split
    (the sampler Trainer builds for ``train_sampling_strategy="group_by_length"``)."""
    batch = bench.spec["batch"] * int(bench.cfg.train.grad_accum)
    sampler = LengthGroupedSampler(batch, lengths=bench.lengths.tolist(),
                                   generator=torch.Generator().manual_seed(seed))
    order = list(sampler)
    return [order[i:i + bench.spec["batch"]] for i in range(0, len(order), bench.spec["batch"])]


def sorted_batches(bench: Bench) -> list[list[int]]:
    """Evaluation batches as ``predict`` forms them: the split sorted by length."""
    order = length_order(bench.features).tolist()
    size = bench.spec["eval_batch"]
    return [order[i:i + size] for i in range(0, len(order), size)]


def at_quantiles(bench: Bench, batches: list[list[int]], k: int) -> list[list[int]]:
    """k full batches at evenly spaced quantiles of padded length (in their epoch order)."""
    full = [b for b in batches if len(b) == len(batches[0])]
    by_len = sorted(range(len(full)), key=lambda i: bench.padded_len(full[i]))
    picks = sorted({by_len[int((j + 0.5) * len(full) / k)] for j in range(k)})
    return [full[i] for i in picks]


def efficiency(bench: Bench, batches: list[list[int]], fixed: bool = False) -> float:
    real = sum(int(bench.lengths[b].sum()) for b in batches)
    processed = sum(len(b) * (bench.spec["max_length"] if fixed else bench.padded_len(b)) for b in batches)
    return real / processed


# ---- one timed phase ----------------------------------------------------------------------------
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


# ---- same science --------------------------------------------------------------------------------
NO_DROPOUT = ["train.head_dropout=0", "model.config_overrides.hidden_dropout_prob=0",
              "model.config_overrides.attention_probs_dropout_prob=0", "train.logging_steps=1"]


def inert(name: str, args, workdir: str, steps: int = 4) -> dict:
    """Padding is inert in training: the small encoder (dropout off) trained on kotune's own
    length-grouped batches, once as kotune pads them and once padded to max_length, takes the same
    steps: per-step losses and the held-out predictions afterwards agree to float rounding."""
    bench = Bench(name, args, workdir, small=True, extra=NO_DROPOUT)
    batches = epoch_batches(bench, args.seed)[:steps]
    rows = [i for b in batches for i in b]
    held_out = at_quantiles(bench, sorted_batches(bench), 2)
    out = {}
    for pipeline in ("kotune", "recipe"):
        bench.reset()
        if pipeline == "kotune":
            trainer = kotune_trainer(bench, bench.subset(rows, "train"), steps, workdir, args.seed,
                                     bench.spec["batch"], replay=True)
        else:
            trainer = recipe_trainer(bench, rows, steps, workdir, args.seed, bench.spec["batch"],
                                     sampling="sequential")
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        out[pipeline] = {"losses": losses, **run_eval_weights(bench, pipeline, held_out, workdir)}
    k, r = out["kotune"], out["recipe"]
    return {"steps": steps, "batch": bench.spec["batch"],
            "max_loss_gap": max(abs(a - b) for a, b in zip(k["losses"], r["losses"])),
            "max_logit_gap": max_logit_gap(bench, k, r), "agreement": agreement(k["outputs"], r["outputs"])}


def run_eval_weights(bench: Bench, pipeline: str, batches, workdir: str) -> dict:
    """run_eval on the current (trained) weights instead of the initial ones."""
    state = {k: v.detach().clone() for k, v in bench.model.state_dict().items()}
    saved, bench.init_state = bench.init_state, state
    try:
        ev = run_eval(bench, pipeline, batches, workdir)
    finally:
        bench.init_state = saved
    return {k: ev[k] for k in ("outputs", "raw", "rows")}


def quality(name: str, args, workdir: str) -> dict:
    """A small encoder trained by both pipelines, each with its own sampler, on the same examples
    for the same steps, with two seeds each: the gap between pipelines against the gap between
    seeds, on held-out examples."""
    q = QUALITY[name]
    scores: dict[str, list[float]] = {"kotune": [], "recipe": []}
    losses: dict[str, list[float]] = {"kotune": [], "recipe": []}
    train_rows = list(range(q["train"]))
    eval_rows = list(range(q["train"], q["train"] + q["eval"]))
    main_metric = None
    for seed in args.quality_seeds:
        bench = Bench(name, args, workdir, small=True,
                      extra=[f"train.seed={seed}", f"train.batch_size={q['batch']}", "train.learning_rate=5e-4"])
        task, examples = bench.built.task, bench.examples
        main_metric = task.main_metric
        held_out = [examples[i] for i in eval_rows]
        for pipeline in ("kotune", "recipe"):
            bench.reset()
            if pipeline == "kotune":
                kotune_trainer(bench, bench.subset(train_rows, "train"), q["steps"], workdir, seed, q["batch"],
                               replay=False).train()
                b = bench.subset(eval_rows, "validation")
                with CapturedPredictions(task) as seen:
                    outputs, _ = predict(kotune_trainer(bench, b, 1, workdir, seed, q["batch"], replay=False),
                                             b, "validation")
                raw = seen.raw
            else:
                trainer = recipe_trainer(bench, train_rows, q["steps"], workdir, seed, q["batch"])
                trainer.train()
                raw = trainer.predict(bench.padded.select(eval_rows)).predictions
                outputs = task.decode(raw, bench.features.select(eval_rows), held_out)
            scores[pipeline].append(task.score(outputs, held_out)[main_metric])
            losses[pipeline].append(held_out_loss(raw, bench.features.select(eval_rows)["labels"]))
            log(f"same science {name} seed {seed} {pipeline}: {main_metric} {scores[pipeline][-1]:.2f}, "
                f"held-out loss {losses[pipeline][-1]:.4f}")
    out = {"metric": main_metric, "steps": q["steps"], "train_examples": q["train"], "eval_examples": q["eval"],
           "batch": q["batch"]}
    for key, values in (("score", scores), ("loss", losses)):
        out[key] = seed_noise_test(values["kotune"], values["recipe"])
    return out


T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def seed_noise_test(k: list[float], r: list[float]) -> dict:
    """Two-sample t-test (pooled seed variance): is the gap between the pipelines' means larger
    than seed-to-seed variation explains (two-sided, 95 %)?"""
    gap = float(np.mean(k) - np.mean(r))
    dof = len(k) + len(r) - 2
    pooled = float(np.sqrt((np.var(k, ddof=1) * (len(k) - 1) + np.var(r, ddof=1) * (len(r) - 1)) / dof))
    se = pooled * float(np.sqrt(1 / len(k) + 1 / len(r)))
    t = abs(gap) / se if se > 0 else (0.0 if gap == 0 else float("inf"))
    critical = T_95.get(dof, 1.96)
    return {"kotune": k, "recipe": r, "pipeline_gap": gap, "seed_std": pooled, "t": t, "t_critical": critical,
            "within_noise": t < critical}


def held_out_loss(logits, labels) -> float:
    """Mean cross-entropy over the labelled positions (rows or tokens; -100 = not scored)."""
    total, count = 0.0, 0
    for row, lab in zip(logits, labels):
        lab = np.asarray(lab).reshape(-1)
        row = np.asarray(row, dtype=np.float64).reshape(-1, np.asarray(row).shape[-1])[: len(lab)]
        keep = lab != -100
        row, lab = row[keep], lab[keep]
        shifted = row - row.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        total -= float(logp[np.arange(len(lab)), lab].sum())
        count += len(lab)
    return total / max(1, count)


# ---- main ----------------------------------------------------------------------------------------
def quick_peak(dtype: torch.dtype) -> float:
    """The matmul rate right now (one FFN-shaped GEMM, ~0.3 s): on a CPU shared with other jobs
    the rate a phase could get moves with their load, so each phase's MFU is taken against the
    mean of the rates measured just before and just after it."""
    return matmul_peak(dtype, **{"repeats": 3, "budget_s": 1.0, "shapes": ((4096, 768, 3072),), **PEAK})


def agreement(a: list, b: list) -> float:
    """Share of rows with the same decoded output (over the shorter list: a prefix of the other)."""
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])) / max(1, n)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="2-layer encoder: a quick run")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two pipelines")
    parser.add_argument("--train-batches", type=int, default=None, help="timed training steps per run")
    parser.add_argument("--eval-batches", type=int, default=None, help="timed evaluation batches per run")
    parser.add_argument("--recipe-batches", type=int, default=None,
                        help="of those, how many the fixed-padding recipe times (its cost per row is constant)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--tasks", default="nli,ner")
    parser.add_argument("--quality", default="nli", help="tasks for the seed-noise training check (nli, ner, "
                        "nli,ner; NER's is slow: the recipe trains at 510 tokens); none: skip the training "
                        "checks (also the padding-is-inert one)")
    parser.add_argument("--quality-seeds", default="1,2")
    parser.add_argument("--out", default=None, help="write throughput.json here (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=42)
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"small": True, "rounds": 1, "train_batches": 1, "eval_batches": 1,
                                     "recipe_batches": 1}, argv)
    if args.smoke:
        SMALL[:], EXTRA[:] = SMOKE_SMALL, SMOKE_DATA
        QUALITY.update(SMOKE_QUALITY)
        PEAK.update(SMOKE_PEAK)
    args.quality_seeds = [int(s) for s in args.quality_seeds.split(",")]
    if not SHARED.exists():
        sys.exit(f"error: ../shared absent ({SHARED}): the benchmark reads KLUE dev files from it")
    quiet_libraries()
    os.environ.setdefault("KOTUNE_PROGRESS", "0")
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="kotune-bench-")
    train_k = args.train_batches or (4 if args.small else 3)
    eval_k = args.eval_batches or (4 if args.small else 2)
    recipe_k = args.recipe_batches or (2 if args.small else 1)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16 if args.precision == "fp16" else torch.float32
    log(f"{'small' if args.small else 'base-size'} encoder, precision {args.precision}, "
        f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")

    benches, plan = {}, {}
    for name in args.tasks.split(","):
        bench = benches[name] = Bench(name, args, workdir, small=args.small)
        tk, ek = train_k, eval_k
        epoch = epoch_batches(bench, args.seed)
        evals = sorted_batches(bench)
        plan[name] = {"train": at_quantiles(bench, epoch, tk), "eval": at_quantiles(bench, evals, ek),
                      "epoch_efficiency": efficiency(bench, epoch), "eval_epoch_efficiency": efficiency(bench, evals)}
        log(f"{name}: {len(bench.examples)} examples, mean {bench.lengths.mean():.1f} tokens, "
            f"{bench.layer_params / 1e6:.1f}M layer parameters; kotune epoch padding efficiency "
            f"{plan[name]['epoch_efficiency']:.1%} (train), {plan[name]['eval_epoch_efficiency']:.1%} (eval); "
            f"timing {tk} train / {ek} eval batches")
        # warm-up (untimed): thread pools, allocator, kernel choice
        run_train(bench, "kotune", plan[name]["train"][:1], workdir, args.seed)

    peaks = [matmul_peak(dtype, **PEAK)]
    rec: dict = {n: {p: {"train": [], "eval": []} for p in ("kotune", "recipe")} for n in benches}
    agree: dict = {n: [] for n in benches}
    gaps: dict = {n: [] for n in benches}
    for r in range(args.rounds):
        for name, bench in benches.items():
            preds = {}
            for pipeline in (("kotune", "recipe") if r % 2 == 0 else ("recipe", "kotune")):
                # the recipe's step cost does not depend on which rows it pads to max_length: it
                # times the first of kotune's batches only (its examples are kotune's)
                k = None if pipeline == "kotune" else recipe_k
                before = quick_peak(dtype)
                ev = run_eval(bench, pipeline, plan[name]["eval"][:k], workdir)  # initial weights
                between = quick_peak(dtype)
                tr = run_train(bench, pipeline, plan[name]["train"][:k], workdir, args.seed)
                after = quick_peak(dtype)
                ev["peak"], tr["peak"] = (before + between) / 2, (between + after) / 2
                peaks.extend([before, between, after])
                preds[pipeline] = {key: ev.pop(key) for key in ("outputs", "raw", "rows")}
                rec[name][pipeline]["eval"].append(ev)
                rec[name][pipeline]["train"].append(tr)
                log(f"round {r + 1} {name} {pipeline}: train {tr['samples'] / tr['s']:.2f} samples/s, "
                    f"eval {ev['samples'] / ev['s']:.2f} samples/s")
            agree[name].append(agreement(preds["kotune"]["outputs"], preds["recipe"]["outputs"]))
            gaps[name].append(max_logit_gap(bench, preds["kotune"], preds["recipe"]))
        peaks.append(matmul_peak(dtype, **PEAK))
    peak = max(peaks)

    report = {"encoder": "small" if args.small else "base", "precision": args.precision, "rounds": args.rounds,
              "threads": torch.get_num_threads(), "device": "cuda" if torch.cuda.is_available() else "cpu",
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "attention": next(iter(benches.values())).model.encoder.config._attn_implementation,
              "timed_batches": {"train": train_k, "eval": eval_k, "recipe": recipe_k},
              "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "matmul_peak_gflops": peak / 1e9, "tasks": {}}
    for name, bench in benches.items():
        t = report["tasks"][name] = {"max_length": bench.spec["max_length"], "batch": bench.spec["batch"],
                                     "eval_batch": bench.spec["eval_batch"],
                                     "mean_tokens": float(bench.lengths.mean()),
                                     "kotune_train_epoch_padding_efficiency": plan[name]["epoch_efficiency"],
                                     "kotune_eval_epoch_padding_efficiency": plan[name]["eval_epoch_efficiency"],
                                     "prediction_agreement": min(agree[name]),
                                     "max_logit_gap": max(gaps[name])}
        for pipeline in ("kotune", "recipe"):
            for phase in ("train", "eval"):
                runs = rec[name][pipeline][phase]
                t[f"{pipeline}_{phase}_samples_per_s"] = median([x["samples"] / x["s"] for x in runs])
                t[f"{pipeline}_{phase}_mfu"] = median([x["flops"] / x["s"] / x["peak"] for x in runs])
                t[f"{pipeline}_{phase}_mfu_vs_best_peak"] = median([x["flops"] / x["s"] / peak for x in runs])
                t[f"{pipeline}_{phase}_peak_mem_mb"] = max(x["mem"] for x in runs) / 2**20
                t[f"{pipeline}_{phase}_padding_efficiency"] = runs[0]["efficiency"]
        for phase in ("train", "eval"):
            t[f"{phase}_speedup"] = t[f"kotune_{phase}_samples_per_s"] / t[f"recipe_{phase}_samples_per_s"]

    if args.quality != "none":
        benches.clear()  # free the base-size models first
        report["padding_inert"] = {name: inert(name, args, workdir) for name in report["tasks"]}
        report["same_science"] = {name: quality(name, args, workdir) for name in args.quality.split(",")}
    report["runtime_s"] = time.perf_counter() - started
    print_report(report)
    out_dir = args.out or workdir
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "throughput.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    log(f"wrote {os.path.join(out_dir, 'throughput.json')}")
    if out_dir != workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    nli, ner = report["tasks"].get("nli", {}), report["tasks"].get("ner", {})
    print(f"RESULT nli_train_speedup={nli.get('train_speedup', float('nan')):.2f} "
          f"ner_train_speedup={ner.get('train_speedup', float('nan')):.2f} "
          f"padding_efficiency={nli.get('kotune_train_epoch_padding_efficiency', float('nan')):.3f} "
          f"mfu={nli.get('kotune_train_mfu', float('nan')):.3f}", flush=True)
    return report


def print_report(report: dict) -> None:
    print(f"\n{report['command']}\nencoder {report['encoder']} ({report['attention']} attention), "
          f"{report['precision']}, {report['threads']} threads on "
          f"{report['device']}; best matmul rate {report['matmul_peak_gflops']:.0f} GFLOP/s; medians of "
          f"{report['rounds']} rounds; {report['runtime_s']:.0f} s", flush=True)
    print("MFU: model FLOPs of the padded shapes / the matmul rate measured just before and after the phase "
          "(MFU*: / the best rate seen)")
    print(f"{'task':5} {'pipeline':8} {'train/s':>8} {'eval/s':>8} {'pad eff':>8} {'MFU':>6} {'MFU*':>6} "
          f"{'eval MFU':>8} {'train MB':>9} {'eval MB':>8}")
    for name, t in report["tasks"].items():
        for p in ("kotune", "recipe"):
            print(f"{name:5} {p:8} {t[f'{p}_train_samples_per_s']:8.2f} {t[f'{p}_eval_samples_per_s']:8.2f} "
                  f"{t[f'{p}_train_padding_efficiency']:8.1%} {t[f'{p}_train_mfu']:6.1%} "
                  f"{t[f'{p}_train_mfu_vs_best_peak']:6.1%} {t[f'{p}_eval_mfu']:8.1%} "
                  f"{t[f'{p}_train_peak_mem_mb']:9.0f} {t[f'{p}_eval_peak_mem_mb']:8.0f}")
        print(f"{name:5} speedup  {t['train_speedup']:7.2f}x {t['eval_speedup']:7.2f}x   (max_length "
              f"{t['max_length']}, mean {t['mean_tokens']:.1f} tokens; whole-epoch padding efficiency "
              f"{t['kotune_train_epoch_padding_efficiency']:.1%} train, "
              f"{t['kotune_eval_epoch_padding_efficiency']:.1%} eval)\n      same weights, both pipelines: same predictions on {t['prediction_agreement']:.1%} "
              f"of the evaluated examples, largest logit difference {t['max_logit_gap']:.1e}")
    for name, q in (report.get("padding_inert") or {}).items():
        print(f"padding is inert {name}: small encoder, dropout off, {q['steps']} steps on kotune's batches of "
              f"{q['batch']}, padded by kotune and to max_length: largest per-step loss difference "
              f"{q['max_loss_gap']:.1e}; afterwards same held-out predictions on {q['agreement']:.1%}, "
              f"largest logit difference {q['max_logit_gap']:.1e}")
    for name, q in (report.get("same_science") or {}).items():
        print(f"same science {name}, small encoder ({q['steps']} steps × {q['batch']} from {q['train_examples']} "
              f"examples, {q['eval_examples']} held out), seeds as listed:")
        for key, label, digits in (("score", q["metric"], 2), ("loss", "held-out loss", 4)):
            v = q[key]
            print(f"  {label}: kotune {fmt(v['kotune'], digits)}, recipe {fmt(v['recipe'], digits)}; "
                  f"difference of means {v['pipeline_gap']:+.{digits}f}, seed std {v['seed_std']:.{digits}f}, "
                  f"t = {v['t']:.2f} (95 % bound {v['t_critical']:.2f}) → "
                  f"{'within' if v['within_noise'] else 'OUTSIDE'} seed noise")


def fmt(values: list[float], digits: int = 2) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


if __name__ == "__main__":
    main()
