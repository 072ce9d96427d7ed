"""Does a CRF help NER here, beyond the noise? KLUE NER entity F1 with and without ``task.crf=true``,
on the pretrained mini encoder of ``bench/pretrain_gain.py`` (its cached pretraining: the same
recipe options find the same checkpoint; a missing one is pretrained first) and its fixed 80/20
split of KLUE NER dev (written once under ``cache_dir/pretrain_gain/``).

Protocol, as pretrain_gain's (nothing is chosen on the evaluation split): each arm's learning rate
is the best of ``--ft-lrs`` on a seeded ``--select-split`` of the training 80 % (seed 1); then every
seed of ``--seeds`` trains on all of it at that rate and is scored on the 20 %. Per arm mean ± sd
over the seeds; the difference CRF − plain paired by seed, its mean ± paired standard error, and
"shown" only where it exceeds two standard errors (either way).

    python -m bench.ner_crf --cache-dir CACHE                      # 5 seeds, 400 steps each
    python -m bench.ner_crf --cache-dir CACHE --model-dir CACHE/pretrain_gain/<hash>/model  # a given encoder
    python -m bench.ner_crf --smoke [--model-dir DIR]   # pretrain_gain's --smoke settings (tests/test_bench_smoke.py)

Prints a table and ``RESULT crf_entity_f1=… plain_entity_f1=… crf_gain=… crf_gain_se=… shown=…``,
and writes ``OUT/ner_crf.json``. Finished runs in ``--out`` are reused.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.pretraining import NER_FILE, SMOKE, Bench, arguments, fixed_splits, pretrain  # noqa: E402
from bench.stats import difference, spread  # noqa: E402

ARMS = {"plain": (), "crf": ("task.crf=true",)}  # arm → its overrides
METRICS = ("entity_f1", "entity_f1_micro", "char_f1")


def main() -> None:
    p = arguments(__doc__, out="kotune_ner_crf")
    p.add_argument("--model-dir", default=None,
                   help="the pretrained mini encoder's directory (default: the recipe's cached pretraining, made if missing)")
    p.add_argument("--arms", default="plain,crf",
                   help="train only these arms (e.g. two processes, one per arm; then all, reusing their runs)")
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {**SMOKE, "out": os.path.join(tempfile.gettempdir(), "kotune_ner_crf_smoke")})
    if not os.path.exists(NER_FILE):
        raise SystemExit(f"skipped: {NER_FILE} not found (../shared absent)")
    import torch

    started = time.time()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}", flush=True)
    model_dir = a.model_dir or pretrain(a, a.cache_dir)[1]
    print(f"pretrained mini encoder: {model_dir}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    bench = Bench(a, model_dir, fixed_splits(a.cache_dir, a.ner_eval_split, seed=0))
    seeds, lrs = [int(s) for s in a.seeds.split(",")], [float(x) for x in a.ft_lrs.split(",")]

    def run(arm: str, lr: float, seed: int, select: bool = False) -> dict:
        tag = "" if arm == "plain" else f"_{arm}"
        return bench.finetune("ner", "pretrained", lr, seed, select=select, tag=tag, options=ARMS[arm])["metrics"]

    arms: dict[str, dict] = {}
    for arm in a.arms.split(","):
        grid = {lr: run(arm, lr, seeds[0], select=True)["entity_f1"] for lr in lrs}
        lr = max(grid, key=grid.get)
        runs = [run(arm, lr, s) for s in seeds]
        arms[arm] = {"lr": lr, "select_scores": grid, "metrics": {m: [r[m] for r in runs] for m in METRICS}}
        print(f"{arm:5s} lr {lr:g} (held-out entity F1: {', '.join(f'{k:g} {v:.2f}' for k, v in grid.items())}): "
              f"entity F1 {spread(arms[arm]['metrics']['entity_f1'])}", flush=True)
    if set(arms) != set(ARMS):
        return
    diffs = {m: difference(arms["crf"]["metrics"][m], arms["plain"]["metrics"][m]) for m in METRICS}
    lines = [f"| metric ({len(seeds)} seeds) | plain (mean ± sd) | CRF (mean ± sd) | CRF − plain ± paired SE "
             "| per seed | beyond 2 SE |", "| --- | --- | --- | --- | --- | --- |"]
    for m, d in diffs.items():
        lines.append(f"| {m} | {spread(arms['plain']['metrics'][m])} | {spread(arms['crf']['metrics'][m])} "
                     f"| {d['mean']:+.2f} ± {d['se']:.2f} | {' / '.join(f'{g:+.1f}' for g in d['gains'])} "
                     f"| {'shown' if d['shown'] else 'not shown'} |")
    print(f"learning rates (chosen on {a.select_split:g} of the training data, seed {seeds[0]}): plain "
          f"{arms['plain']['lr']:g}, CRF {arms['crf']['lr']:g}; {a.ft_steps} steps, batch {a.ft_batch}, "
          f"max_length {a.ft_max_length}")
    print("\n".join(lines))
    minutes = (time.time() - started) / 60
    with open(os.path.join(a.out, "ner_crf.json"), "w") as f:
        json.dump({"args": vars(a), "arms": arms, "differences": diffs, "minutes": minutes,
                   "load": os.getloadavg()}, f, indent=1)
    d = diffs["entity_f1"]
    print(f"bench: {minutes:.1f} min, load {os.getloadavg()[0]:.1f}")
    print(f"RESULT crf_entity_f1={statistics.mean(arms['crf']['metrics']['entity_f1']):.2f} "
          f"plain_entity_f1={statistics.mean(arms['plain']['metrics']['entity_f1']):.2f} "
          f"crf_gain={d['mean']:.2f} crf_gain_se={d['se']:.2f} shown={str(d['shown']).lower()}")


if __name__ == "__main__":
    main()
