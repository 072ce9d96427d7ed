"""Multi-label hate speech (``task=hate_multi_label``): the ``bias`` and ``hate`` columns as one set of
four labels {gender, others, hate, offensive}, zero to two per comment; train.tsv → dev.tsv (471).
Fine-tunes kotune's random tiny encoder and the pretrained mini encoder of bench/pretrain_gain.py
(``--model-dir``), each deciding at 0.5 (``task.threshold=0.5``) and with ``task.threshold=tune``
(10 % of train.tsv held out of training picks each label's threshold).

Protocol (nothing is chosen on dev): each encoder × decision's learning rate is the best micro F1
of ``--lrs`` (with that decision) on a seeded ``--select-split`` of train.tsv (seed 1); every seed
then trains at that rate. Table: micro F1 (main), macro F1, samples F1, subset accuracy, mean ± sd over
seeds; the paired difference tune − 0.5 per seed with its standard error, "shown" where |mean| > 2 SE.

    python -m bench.multi_label --model-dir DIR      # DIR: printed by bench/pretrain_gain.py --only-pretrain
    python -m bench.multi_label --smoke --model-dir DIR   # both encoders and decisions, tiny (tests/test_bench_smoke.py)

Prints the table and ``RESULT <model>_micro_f1=… <model>_macro_f1=… <model>_subset_accuracy=… …``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import (SMOKE, evaluation, fine_tuning_options, hate_speech, select_lr,  # noqa: E402
                               training_overrides)
from bench.jobs import job  # noqa: E402
from bench.stats import paired_gain, spread  # noqa: E402

METRICS = ("micro_f1", "macro_f1", "samples_f1", "subset_accuracy")
DECISIONS = {"0.5": ["task.threshold=0.5"], "tune": ["task.threshold=tune"]}  # tune is the default


def label_sets(path: str) -> list[set[str]]:
    """Each comment's label set in a hate-speech TSV (bias and hate, none meaning no label)."""
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [{v for v in (r["bias"], r["hate"]) if v != "none"} for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,mini")
    fine_tuning_options(p, "1,2,3", "kotune_multi_label")
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {**SMOKE, "out": os.path.join(tempfile.gettempdir(), "kotune_multi_label_smoke")})
    data = hate_speech(a)
    seeds, lrs = [int(s) for s in a.seeds.split(",")], [float(x) for x in a.lrs.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    started = time.time()
    dev_sets = label_sets(f"{data}/dev.tsv")
    train_sets = label_sets(f"{data}/train.tsv")
    print(f"train {len(train_sets)} comments: " + ", ".join(
        f"{n} labels {sum(len(s) == n for s in train_sets)}" for n in range(3)) + "; dev: "
        + ", ".join(f"{n} labels {sum(len(s) == n for s in dev_sets)}" for n in range(3)), flush=True)

    def run(model: str, decision: str, lr: float, seed: int, select: bool = False) -> dict:
        return job(["task=hate_multi_label", f"data.train_file={data}/train.tsv",
                    *evaluation(f"{data}/dev.tsv", select, a.select_split), *DECISIONS[decision],
                    *training_overrides(a, model, lr, seed), "save_predictions=false"],
                   os.path.join(a.out, f"{model}_{decision}_lr{lr:g}_s{seed}{'_select' if select else ''}"))

    table, result = {}, []
    for model in a.models.split(","):
        for decision in DECISIONS:
            lr, grid = select_lr(lambda lr, s, select: run(model, decision, lr, s, select), lrs, "micro_f1")
            print(f"{model} {decision}: lr {lr:g} (held-out micro F1: "
                  + ", ".join(f"lr {k:g} {v:.2f}" for k, v in grid.items()) + ")", flush=True)
            runs = [run(model, decision, lr, s) for s in seeds]
            table[(model, decision)] = {"lr": lr, "select": grid, **{m: [r["metrics"][m] for r in runs] for m in METRICS},
                                        "thresholds": [r["decision"]["thresholds"] for r in runs]}
            print(f"{model} {decision}: micro F1 {spread(table[(model, decision)]['micro_f1'])}", flush=True)
    lines = [f"| encoder | decision | {' | '.join(METRICS)} |", "|" + " --- |" * (2 + len(METRICS))]
    for (model, decision), row in table.items():
        lines.append(f"| {model} (lr {row['lr']:g}) | {decision} | " + " | ".join(spread(row[m]) for m in METRICS) + " |")
    lines += ["", "| encoder | tune − 0.5 | " + " | ".join(METRICS) + " |", "|" + " --- |" * (2 + len(METRICS))]
    for model in a.models.split(","):
        gains = {m: paired_gain(table[(model, "tune")][m], table[(model, "0.5")][m]) for m in METRICS}
        lines.append(f"| {model} | ± paired SE | " + " | ".join(
            f"{g['mean']:+.2f} ± {g['se']:.2f} ({'shown' if abs(g['mean']) > 2 * g['se'] else 'not shown'})"
            for g in gains.values()) + " |")
        result += [f"{model}_{d}_{m}={sum(table[(model, d)][m]) / len(seeds):.2f}" for d in DECISIONS for m in METRICS[:2]]
        result.append(f"{model}_tune_gain_micro_f1={gains['micro_f1']['mean']:.2f}")
    empty = 100.0 * sum(not s for s in dev_sets) / len(dev_sets)
    lines.append(f"\nsubset accuracy of always predicting the empty set on dev: {empty:.2f}")
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    minutes = (time.time() - started) / 60
    with open(os.path.join(a.out, "multi_label.json"), "w") as f:
        json.dump({"args": vars(a), "table": {f"{m}/{d}": v for (m, d), v in table.items()}, "minutes": minutes,
                   "load_average_end": os.getloadavg()[0]}, f, indent=1)
    print(f"bench: {minutes:.1f} min, load average at the end {os.getloadavg()[0]:.1f}")
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
