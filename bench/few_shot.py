"""Few-shot classification: SetFit-style training (``mode=setfit``: the encoder's contrastive stage on
pairs of the few rows, then a head on its fixed mean-pooled embedding) against plain fine-tuning
(``mode=finetune``) on the same rows, at 8, 16 and 32 rows per class of hate speech (``--column``:
none / offensive / hate; ``data.examples_per_class=N`` draws them from train.tsv with the run's seed,
so both arms of a seed see the same rows), scored on dev.tsv's 471 comments (macro F1; ``--eval-rows``
cuts the dev set to its first rows). The encoder is the mini pretrained encoder of
bench/pretrain_gain.py (``--model-dir``).

Per shot count the paired difference d_s = setfit_s − plain_s over the seeds: its mean and paired
standard error sd(d)/√n; "shown" only where |mean| > 2 SE, else "not shown".

    python -m bench.few_shot --model-dir DIR          # DIR: python -m bench.pretrain_gain --only-pretrain's model/
    python -m bench.few_shot --smoke --model-dir DIR  # tiny settings, every step (tests/test_bench_smoke.py)

Prints the table and ``RESULT few_shot shots=8 plain=… setfit=… gain=…±… (per shot count) seeds=…``;
every job is an in-process ``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory
already holds an ok result.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import SMOKE, fine_tuning_options, hate_speech, model_overrides  # noqa: E402
from bench.jobs import job  # noqa: E402
from bench.stats import difference, spread  # noqa: E402

ARMS = ("plain", "setfit")


def arm_overrides(a, arm: str) -> list[str]:
    """What differs between the arms: the mode and its learning rates and steps."""
    if arm == "plain":
        return ["mode=finetune", f"train.learning_rate={a.lr}", f"train.max_steps={a.steps}"]
    return ["mode=setfit", f"mode.pairs_per_example={a.pairs}", f"mode.body_learning_rate={a.body_lr}",
            f"mode.body_batch_size={a.batch}", f"train.learning_rate={a.head_lr}", f"train.max_steps={a.head_steps}"]


def run(a, arm: str, shots: int, seed: int) -> float:
    data = hate_speech(a)
    overrides = ["task=text_cls", f"data.train_file={data}/train.tsv", f"data.validation_file={data}/dev.tsv",
                 "data.text_column=comments", f"data.label_column={a.column}", f"data.examples_per_class={shots}",
                 *model_overrides("mini", a.model_dir, a.cache_dir), *arm_overrides(a, arm), f"train.seed={seed}",
                 f"train.batch_size={a.batch}", f"train.max_length={a.max_length}", "train.warmup_ratio=0.1",
                 "save_model=false", "save_predictions=false",
                 *([f"data.max_eval_samples={a.eval_rows}"] if a.eval_rows else [])]
    res = job(overrides, os.path.join(a.out, f"{arm}_n{shots}_s{seed}"))
    return float(res["metrics"]["macro_f1"])


def table(found: dict, a, seeds: list[int]) -> list[str]:
    lines = [f"mini pretrained encoder; plain: {a.steps} steps at lr {a.lr:g}; setfit: {a.pairs} × 2 pairs per row at "
             f"lr {a.body_lr:g}, then the head {a.head_steps} steps at lr {a.head_lr:g}; batch {a.batch}; "
             f"{len(seeds)} seeds; dev macro F1 ({a.eval_rows or 'all'} rows)", "",
             "| rows per class | plain fine-tuning (mean ± sd) | SetFit-style (mean ± sd) | SetFit − plain ± paired SE "
             "| > 2 SE |", "| --- | --- | --- | --- | --- |"]
    for shots, f in found.items():
        d = f["difference"]
        lines.append(f"| {shots} | {spread(f['plain'])} | {spread(f['setfit'])} | {d['mean']:+.2f} ± {d['se']:.2f} | "
                     f"{'shown' if d['shown'] else 'not shown'} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fine_tuning_options(p, seeds="1,2,3,4,5", out="kotune_few_shot")
    p.add_argument("--column", default="hate", help="hate-speech label column")
    p.add_argument("--shots", default="8,16,32", help="rows per class (data.examples_per_class)")
    p.add_argument("--lr", type=float, default=3e-4, help="plain fine-tuning's learning rate")
    p.add_argument("--pairs", type=int, default=20, help="mode.pairs_per_example (setfit's num_iterations)")
    p.add_argument("--body-lr", type=float, default=1e-4, help="mode.body_learning_rate (the contrastive stage)")
    p.add_argument("--head-lr", type=float, default=1e-2,
                   help="the linear head's learning rate after the stage (setfit's head_learning_rate, mode=setfit's default)")
    p.add_argument("--head-steps", type=int, default=100)
    p.add_argument("--eval-rows", type=int, default=None, help="score the first N dev rows (default: all 471)")
    from bench.common import parse_with_smoke

    p.set_defaults(steps=100, batch=16)
    a = parse_with_smoke(p, {"steps": SMOKE["steps"], "head_steps": SMOKE["steps"], "batch": SMOKE["batch"],
                             "max_length": SMOKE["max_length"], "seeds": SMOKE["seeds"], "shots": "2,4", "pairs": 1,
                             "eval_rows": 64, "out": os.path.join(tempfile.gettempdir(), "kotune_few_shot_smoke")})
    if not a.model_dir:
        raise SystemExit("--model-dir DIR is needed (the mini encoder: python -m bench.pretrain_gain --only-pretrain)")
    import torch

    seeds, shot_counts = [int(s) for s in a.seeds.split(",")], [int(n) for n in a.shots.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    started, found = time.time(), {}
    for shots in shot_counts:
        scores = {arm: [] for arm in ARMS}
        for seed in seeds:
            for arm in ARMS:
                scores[arm].append(run(a, arm, shots, seed))
            print(f"{shots} per class, seed {seed}: plain {scores['plain'][-1]:.2f}, setfit {scores['setfit'][-1]:.2f} "
                  f"macro F1 ({time.time() - started:.0f} s)", flush=True)
        found[shots] = {**scores, "difference": difference(scores["setfit"], scores["plain"])}
    print("\n".join(table(found, a, seeds)))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "few_shot.json"), "w", encoding="utf-8") as fh:
        json.dump({"args": vars(a), "shots": found}, fh, indent=1, default=str)
    parts = [f"shots={n} plain={sum(f['plain']) / len(seeds):.2f} setfit={sum(f['setfit']) / len(seeds):.2f} "
             f"gain={f['difference']['mean']:+.2f}±{f['difference']['se']:.2f}" for n, f in found.items()]
    print(f"RESULT few_shot {' '.join(parts)} seeds={len(seeds)} wall_s={time.time() - started:.0f}")


if __name__ == "__main__":
    main()
