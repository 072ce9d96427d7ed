"""Full fine-tuning against LoRA against a frozen encoder (and fine-tuning with layer-wise
learning-rate decay), measured:

(a) **cost** on a BERT-base-shaped random encoder (the kcbert-base config of
    ``../shared/vocab/kcbert-base``: 12 layers × 768, 30,000 WordPieces): trainable parameters,
    training samples/s, the peak memory the job adds, and the size of the run's ``model/`` and of
    its last Trainer checkpoint (``checkpoints/checkpoint-N``: weights + optimizer state). Every
    batch is ``--cost-batch`` × 128 tokens (``train.pad_to_multiple_of=128``), on hate-speech
    comments. Peak memory is the resident set sampled every 5 ms above its level when the job
    starts (``bench/common.PeakMemory``; the CUDA allocator's peak on a GPU), building the model
    included. All jobs run in this one process, speeds are ratios to full fine-tuning's, and
    fine-tuning runs again last as a control for the order. ``mode=frozen`` runs with
    ``mode.cache=false`` here, so that every mode's step reads the encoder (the cache, its default,
    trains the head on stored states instead).
(b) **quality** on the pretrained mini encoder of ``bench/pretrain_gain.py`` (``--model-dir``):
    hate-speech accuracy and KLUE NER entity F1 (its fixed 80/20 split), pretrain_gain's protocol
    and machinery (``Bench``): each mode's learning rate is the best of its own grid on a seeded
    slice of its training data, then every seed trains on all of it; mean ± sd, and each mode's
    paired difference from full fine-tuning with its standard error, "shown" only beyond 2 SE
    (either way).

    python -m bench.modes --model-dir /path/to/pretrain_gain/<recipe>/model
    python -m bench.modes --skip-quality                  # the cost part only
    python -m bench.modes --smoke --model-dir DIR   # both parts, tiny (tests/test_bench_smoke.py)

Prints a table per part and ``RESULT lora_checkpoint_pct=… lora_memory_ratio=… …``; writes
``OUT/modes.json``. Finished quality runs in ``--out`` are reused (pretrain_gain's ``job``).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.jobs import job  # noqa: E402
from bench.pretraining import METRIC, SHARED, Bench, fixed_splits  # noqa: E402
from bench.stats import paired_gain, spread  # noqa: E402

VOCAB = os.path.join(os.path.dirname(SHARED), "vocab", "kcbert-base")
MODES = {  # the mode's overrides, for both parts
    "finetune": [],
    "lora": ["mode=lora"],
    "frozen": ["mode=frozen"],
    "finetune+lld0.8": ["train.layer_lr_decay=0.8"],  # ELECTRA's decay for base models
}
GRIDS = {  # learning rates tried per mode on the selection slice (fine-tuning: pretrain_gain's grid; the
    # adapters and a head alone train at higher rates)
    "finetune": "3e-4,1e-3", "finetune+lld0.8": "3e-4,1e-3", "lora": "1e-3,3e-3", "frozen": "3e-3,1e-2",
}
COST_ONLY = {"frozen": ["mode.cache=false"]}
# --smoke: the cost part's encoder shrunk (the kcbert-base vocabulary kept); each mode's first rate only
SMOKE_ENCODER = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
                 "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]
SMOKE = dict(cost_steps=1, cost_batch=1, seeds="1", ft_steps=2, ft_batch=8, ft_max_length=64,
             out=os.path.join(tempfile.gettempdir(), "kotune_modes_smoke"))
SHORT = {"finetune+lld0.8": "lld", "lora": "lora", "frozen": "frozen"}  # RESULT names


def dir_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2 ** 20


def cost_job(a, mode: str, run_dir: str, steps: int) -> dict:
    """One training job of ``mode`` on the base-shaped encoder: its results, peak memory and sizes."""
    from bench.common import PeakMemory

    batch = a.cost_batch
    overrides = ["task=text_cls", f"data.train_file={SHARED}/hate-speech/train.tsv", "data.text_column=comments",
                 "data.label_column=hate", "data.format=tsv", f"data.validation_file={SHARED}/hate-speech/dev.tsv",
                 f"data.max_train_samples={max(64, steps * batch)}", "data.max_eval_samples=16",
                 "model=kcbert", f"model.name_or_path={VOCAB}", "model.init=random",
                 f"train.max_steps={steps}", f"train.batch_size={batch}", "train.max_length=128",
                 "train.pad_to_multiple_of=128", "train.group_by_length=false", "train.learning_rate=1e-4",
                 "train.warmup_ratio=0", f"train.logging_steps={steps}", "train.save_strategy=steps",
                 f"train.save_steps={steps}", "train.save_total_limit=1", "train.seed=1", "save_predictions=false",
                 f"cache_dir={a.cache_dir}", *MODES[mode], *COST_ONLY.get(mode, []),
                 *(SMOKE_ENCODER if a.smoke else [])]
    with PeakMemory() as peak:
        res = job(overrides, run_dir)
    return {"mode": mode, "trainable_params": res["trainable_params"], "total_params": res["total_params"],
            "samples_per_s": res["train_samples_per_second"], "peak_mb": peak.peak_bytes / 2 ** 20,
            "model_mb": dir_mb(os.path.join(run_dir, "model")),
            "checkpoint_mb": dir_mb(os.path.join(run_dir, "checkpoints", f"checkpoint-{steps}"))}


def cost(a) -> list[dict]:
    import shutil

    rows = []
    shutil.rmtree(os.path.join(a.out, "cost"), ignore_errors=True)  # measured afresh every time
    started = time.time()
    cost_job(a, "finetune", os.path.join(a.out, "cost", "warmup"), steps=1)  # one-time allocations, not measured
    print(f"cost warm-up (1 step, not measured): {time.time() - started:.0f} s", flush=True)
    order = [*MODES, "finetune"]  # fine-tuning again last: does the order move the figures?
    for k, mode in enumerate(order):
        run_dir = os.path.join(a.out, "cost", f"{k}_{mode}")
        started = time.time()
        rows.append(cost_job(a, mode, run_dir, a.cost_steps))
        print(f"cost {mode}: {time.time() - started:.0f} s wall, {rows[-1]}", flush=True)
    rows[-1]["mode"] = "finetune (again, last)"
    return rows


def cost_table(rows: list[dict]) -> str:
    full = rows[0]
    lines = [f"| mode (kcbert-base shape, random init) | trainable params | train samples/s (× finetune) "
             "| peak memory MB (× finetune) | model/ MB (% of finetune) | Trainer checkpoint MB |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['trainable_params']:,} ({100 * r['trainable_params'] / r['total_params']:.2f} %) "
                     f"| {r['samples_per_s']:.2f} ({r['samples_per_s'] / full['samples_per_s']:.2f}×) "
                     f"| {r['peak_mb']:.0f} ({r['peak_mb'] / full['peak_mb']:.2f}×) "
                     f"| {r['model_mb']:.1f} ({100 * r['model_mb'] / full['model_mb']:.2f} %) "
                     f"| {r['checkpoint_mb']:.1f} |")
    return "\n".join(lines)


def quality(a, seeds: list[int]) -> dict:
    """Per (task, mode): the chosen learning rate, its selection scores and every seed's score."""
    bench = Bench(a, a.model_dir, fixed_splits(a.cache_dir, 0.2, seed=0))
    out: dict = {}
    for task in a.tasks.split(","):
        for mode, extra in MODES.items():
            tag = "_" + mode.replace("+", "_")
            lrs = GRIDS[mode].split(",")[: 1 if a.smoke else None]
            grid = {float(lr): bench.score(task, "pretrained", float(lr), seeds[0], select=True, tag=tag,
                                           options=tuple(extra)) for lr in lrs}
            lr = max(grid, key=grid.get)
            scores = [bench.score(task, "pretrained", lr, s, tag=tag, options=tuple(extra)) for s in seeds]
            out[(task, mode)] = {"lr": lr, "select_scores": grid, "scores": scores}
            print(f"{task:5s} {mode:16s} lr {lr:g} (held-out: " + ", ".join(f"{k:g} {v:.2f}" for k, v in grid.items())
                  + f"): {spread(scores)}", flush=True)
    return out


def quality_table(results: dict, seeds: list[int]) -> tuple[str, dict]:
    lines = [f"| task (metric; {len(seeds)} seeds) | mode | lr | mean ± sd | − finetune ± paired SE | beyond 2 SE |",
             "| --- | --- | --- | --- | --- | --- |"]
    differences = {}
    for (task, mode), r in results.items():
        if mode == "finetune":
            cell, shown = "", ""
        else:
            d = paired_gain(r["scores"], results[(task, "finetune")]["scores"])
            differences[(task, mode)] = d
            cell = f"{d['mean']:+.2f} ± {d['se']:.2f}"
            shown = "shown" if abs(d["mean"]) > 2 * d["se"] else "not shown"
        lines.append(f"| {task} ({METRIC[task]}) | {mode} | {r['lr']:g} | {spread(r['scores'])} | {cell} | {shown} |")
    return "\n".join(lines), differences


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cost-steps", type=int, default=6, help="training steps of each cost job")
    p.add_argument("--cost-batch", type=int, default=8, help="sequences of 128 tokens per step")
    p.add_argument("--skip-cost", action="store_true")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--model-dir", help="the pretrained mini encoder (python -m bench.pretrain_gain --only-pretrain "
                                       "prints it)")
    p.add_argument("--tasks", default="hate,ner")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--ft-steps", type=int, default=400)
    p.add_argument("--ft-batch", type=int, default=32)
    p.add_argument("--ft-max-length", type=int, default=128)
    p.add_argument("--select-split", type=float, default=0.15,
                   help="held-out fraction of the training data that picks each mode's learning rate (seed 1's split)")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_modes"))
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, SMOKE)
    a.pooling = None  # Bench's option: the preset's pooling
    if not os.path.isdir(VOCAB) or not os.path.isdir(os.path.join(SHARED, "hate-speech")):
        raise SystemExit(f"skipped: {VOCAB} or {SHARED}/hate-speech not found (../shared absent)")
    if not a.skip_quality and not (a.model_dir and os.path.exists(os.path.join(a.model_dir, "config.json"))):
        raise SystemExit("--model-dir: the pretrained mini encoder's directory is needed for the quality part "
                         "(python -m bench.pretrain_gain --only-pretrain prints it; or --skip-quality)")
    import torch

    os.makedirs(a.out, exist_ok=True)
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start", flush=True)
    summary: dict = {"args": vars(a), "load_at_start": load}
    result: list[str] = []
    if not a.skip_cost:
        rows = cost(a)
        print(cost_table(rows))
        summary["cost"] = rows
        full, lora, frozen = rows[0], rows[MODE_INDEX["lora"]], rows[MODE_INDEX["frozen"]]
        result += [f"lora_checkpoint_pct={100 * lora['model_mb'] / full['model_mb']:.2f}",
                   f"lora_trainer_checkpoint_pct={100 * lora['checkpoint_mb'] / full['checkpoint_mb']:.2f}",
                   f"lora_memory_ratio={lora['peak_mb'] / full['peak_mb']:.2f}",
                   f"lora_speed_ratio={lora['samples_per_s'] / full['samples_per_s']:.2f}",
                   f"frozen_memory_ratio={frozen['peak_mb'] / full['peak_mb']:.2f}",
                   f"finetune_rerun_memory_ratio={rows[-1]['peak_mb'] / full['peak_mb']:.2f}"]
    if not a.skip_quality:
        seeds = [int(s) for s in a.seeds.split(",")]
        results = quality(a, seeds)
        table, differences = quality_table(results, seeds)
        print(table)
        summary["quality"] = {f"{t}/{m}": r for (t, m), r in results.items()}
        summary["differences"] = {f"{t}/{m}": d for (t, m), d in differences.items()}
        result += [f"{t}_{SHORT[m]}_minus_finetune={d['mean']:.2f} {t}_{SHORT[m]}_se={d['se']:.2f}"
                   for (t, m), d in differences.items()]
    load = os.getloadavg()
    summary["load_at_end"] = load
    print(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end")
    with open(os.path.join(a.out, "modes.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print("RESULT " + " ".join(result))


MODE_INDEX = {mode: k for k, mode in enumerate(MODES)}

if __name__ == "__main__":
    main()
