"""Do balanced class weights help an imbalanced task, beyond the noise? Hate speech's ``bias`` column
(none 5,148 / others 1,516 / gender 1,232 in train.tsv; dev.tsv's 471 comments are scored), fine-tuned
with ``train.class_weights=none`` and ``=balanced`` on one encoder (``--model-dir``: the pretrained
mini encoder of bench/pretrain_gain.py; ``--model tiny`` for kotune's random tiny one).

Protocol (nothing is chosen on dev): each arm's learning rate is the best macro F1 of ``--lrs`` on a
seeded ``--select-split`` of train.tsv (seed 1); then every seed trains on all of train.tsv at that
rate and is scored on dev. Per seed the paired difference d_s = balanced_s − none_s; its mean and
paired standard error sd(d)/√n; "shown" only where |mean| > 2 SE. Each class's F1 comes from the
runs' predictions.jsonl (where the weights should act: the minority classes).

    python -m bench.class_weights --model-dir DIR   # DIR: printed by bench/pretrain_gain.py --only-pretrain
    python -m bench.class_weights --smoke --model-dir DIR   # tiny settings, every step (tests/test_bench_smoke.py)

Where the arms chose different rates, both arms also train at each chosen rate (a control: the
difference at one rate is the weights' alone). Prints the tables and ``RESULT class_weights_macro_f1_gain=… se=… shown=…``; every job is an in-process
``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory already holds an ok result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import (SMOKE, evaluation, fine_tuning_options, hate_speech, select_lr,  # noqa: E402
                               training_overrides)
from bench.jobs import job  # noqa: E402
from bench.stats import paired_gain, spread  # noqa: E402

ARMS = ("none", "balanced")


def per_class_f1(predictions_file: str, labels: list[str]) -> dict[str, float]:
    """Each class's F1 ×100 from a run's predictions.jsonl (prediction and gold per row)."""
    rows = [json.loads(line) for line in open(predictions_file, encoding="utf-8")]
    out = {}
    for c in labels:
        tp = sum(r["prediction"] == c and r["gold"] == c for r in rows)
        predicted, gold = sum(r["prediction"] == c for r in rows), sum(r["gold"] == c for r in rows)
        out[c] = 200.0 * tp / (predicted + gold) if predicted + gold else 0.0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mini", choices=("mini", "tiny"))
    p.add_argument("--column", default="bias", help="hate-speech label column")
    fine_tuning_options(p, "1,2,3,4,5", "kotune_class_weights")
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {**SMOKE, "out": os.path.join(tempfile.gettempdir(), "kotune_class_weights_smoke")})
    data = hate_speech(a)
    import torch

    seeds, lrs = [int(s) for s in a.seeds.split(",")], [float(x) for x in a.lrs.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    started = time.time()

    def run(arm: str, lr: float, seed: int, select: bool = False) -> dict:
        return job(["task=text_cls", f"data.train_file={data}/train.tsv",
                    *evaluation(f"{data}/dev.tsv", select, a.select_split),
                    "data.text_column=comments", f"data.label_column={a.column}", f"train.class_weights={arm}",
                    *training_overrides(a, a.model, lr, seed)],
                   os.path.join(a.out, f"{a.model}_{arm}_lr{lr:g}_s{seed}{'_select' if select else ''}"))

    arms = {}
    for arm in ARMS:
        lr, grid = select_lr(lambda lr, s, select: run(arm, lr, s, select), lrs, "macro_f1")
        print(f"{arm:9s} lr {lr:g} (held-out macro F1: " + ", ".join(f"lr {k:g} {v:.2f}" for k, v in grid.items())
              + ")", flush=True)
        results = [run(arm, lr, s) for s in seeds]
        arms[arm] = {"lr": lr, "select": grid, "results": results,
                     "macro_f1": [r["metrics"]["macro_f1"] for r in results],
                     "accuracy": [r["metrics"]["accuracy"] for r in results]}
        labels = sorted({json.loads(line)["gold"] for line in open(results[0]["predictions_file"], encoding="utf-8")})
        arms[arm]["per_class"] = [per_class_f1(r["predictions_file"], labels) for r in results]
        print(f"{arm:9s} macro F1 {spread(arms[arm]['macro_f1'])} ({', '.join(f'{x:.2f}' for x in arms[arm]['macro_f1'])})",
              flush=True)
    weights = arms["balanced"]["results"][0]["class_weights"]
    labels = list(weights)  # the task's label order
    macro = paired_gain(arms["balanced"]["macro_f1"], arms["none"]["macro_f1"])
    acc = paired_gain(arms["balanced"]["accuracy"], arms["none"]["accuracy"])

    def verdict(g: dict) -> str:
        return "shown" if len(seeds) > 1 and abs(g["mean"]) > 2 * g["se"] else "not shown"

    counts = ", ".join(f"{n} {w['count']:,}" for n, w in weights.items())
    balanced = ", ".join(f"{n} {w['weight']:.2f}" for n, w in weights.items())
    lines = [f"hate speech `{a.column}` (train {counts}; balanced weights {balanced}), "
             f"{a.model} encoder, {a.steps} steps, {len(seeds)} seeds, dev {arms['none']['results'][0]['n_eval']}",
             "", "| metric (dev) | none (mean ± sd) | balanced (mean ± sd) | balanced − none ± paired SE | > 2 SE |",
             "| --- | --- | --- | --- | --- |",
             f"| macro F1 | {spread(arms['none']['macro_f1'])} (lr {arms['none']['lr']:g}) | "
             f"{spread(arms['balanced']['macro_f1'])} (lr {arms['balanced']['lr']:g}) | "
             f"{macro['mean']:+.2f} ± {macro['se']:.2f} | {verdict(macro)} |",
             f"| accuracy | {spread(arms['none']['accuracy'])} | {spread(arms['balanced']['accuracy'])} | "
             f"{acc['mean']:+.2f} ± {acc['se']:.2f} | {verdict(acc)} |"]
    for c in labels:
        none_c = [x[c] for x in arms["none"]["per_class"]]
        bal_c = [x[c] for x in arms["balanced"]["per_class"]]
        g = paired_gain(bal_c, none_c)
        lines.append(f"| F1 {c} | {spread(none_c)} | {spread(bal_c)} | {g['mean']:+.2f} ± {g['se']:.2f} | {verdict(g)} |")
    same_lr = {}
    for lr in sorted({v["lr"] for v in arms.values()}):  # the control: both arms at one rate, seed by seed
        scores = {arm: [run(arm, lr, s)["metrics"]["macro_f1"] for s in seeds] for arm in ARMS}
        same_lr[lr] = {**scores, "gain": paired_gain(scores["balanced"], scores["none"])}
    if len(same_lr) > 1:
        lines += ["", "the arms chose different rates; both arms at each rate (macro F1):", "",
                  "| lr | none | balanced | balanced − none ± paired SE | > 2 SE |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {lr:g} | {spread(v['none'])} | {spread(v['balanced'])} | {v['gain']['mean']:+.2f} ± "
                  f"{v['gain']['se']:.2f} | {verdict(v['gain'])} |" for lr, v in same_lr.items()]
    print("\n".join(lines))
    summary = {"args": vars(a), "same_lr": {f"{lr:g}": v for lr, v in same_lr.items()}, "arms": {k: {x: v[x] for x in ("lr", "select", "macro_f1", "accuracy", "per_class")}
                                         for k, v in arms.items()},
               "class_weights": weights, "macro_f1_gain": macro, "accuracy_gain": acc,
               "minutes": (time.time() - started) / 60, "load_average_end": os.getloadavg()[0]}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "class_weights.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"bench: {summary['minutes']:.1f} min, load average at the end {summary['load_average_end']:.1f}")
    print(f"RESULT class_weights_macro_f1_gain={macro['mean']:.2f} se={macro['se']:.2f} "
          f"shown={verdict(macro) == 'shown'} none={statistics.mean(arms['none']['macro_f1']):.2f} "
          f"balanced={statistics.mean(arms['balanced']['macro_f1']):.2f}")


if __name__ == "__main__":
    main()
