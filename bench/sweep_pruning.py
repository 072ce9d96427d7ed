"""What does median pruning (``hparams_search.pruner=median``) save in a sweep, and what does it cost
in the best score found?

Each arm is the same Optuna search run through the command line, as a user runs it:
``python run.py -m hparams_search=text_cls model=tiny data=demo`` with ``train.max_steps`` steps per
trial, evaluations ``train.evals_per_epoch`` times per epoch (``train.select_best=true``), batch size
fixed (so every trial's evaluation k comes after the same amount of data), and the learning rate
(``--lr-range``), the preset's warm-up and dropout ranges searched for ``--trials`` trials. The
learning-rate range is conf/hparams_search/_finetune.yaml's example override: with 240 steps, the
preset's range for a random encoder (1e-4…1e-3) left all ten trials of a first try at the majority
class (macro F1 16.90), where neither arm can win anything. The arms differ only in the pruner
(none, median with optuna's defaults: 5 finished trials first, no warm-up), and are paired by the
sampler's seed (``--seeds``). TPE draws its first 10 trials at random (seeded by the trial's number),
so with ``--trials`` 10 both arms try the same configurations and differ only in what pruning
stops; beyond 10, what the sampler has seen (pruned trials' last values) steers later draws apart.

Per sweep: wall time (the whole command, start-up included), optimizer steps trained over all trials
(the machine-independent cost), finished / pruned trials, and the best trial's dev score in the
task's main metric (macro F1 for text_cls; the objective the search maximises, chosen and reported
on the same split, as any sweep's best value).
Over seeds: the ratios none/median of wall time and steps, and the paired difference of the best
score (median − none) with its standard error; "shown" only beyond 2 SE.

    python -m bench.sweep_pruning                          # 10 trials × 300 steps, seeds 0 1 2
    python -m bench.sweep_pruning --smoke   # 2 trials × 4 steps on 32 rows, seed 0, pruning after 1 trial

Prints a table and ``RESULT sweep_pruning_wall_ratio=… steps_ratio=… best_diff=… se=… shown=…``;
writes OUT/sweep_pruning.json. A finished sweep in OUT is reused (its study is complete: the command
returns at once), so rerunning only adds what is missing; its wall time is then the first run's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ARMS = ("none", "median")
# --smoke: 32 training rows (an epoch of 4 steps: an evaluation every step) and the median pruner's start after
# one finished trial instead of 5, so that the second trial can be pruned
SMOKE = dict(trials=2, steps=4, batch_size=8, seeds=[0],
             out=os.path.join(tempfile.gettempdir(), "kotune_sweep_pruning_smoke"))
SMOKE_OVERRIDES = ["data.max_train_samples=32", "data.max_eval_samples=32", "hydra.sweeper.pruner_startup_trials=1"]


def sweep_command(arm: str, seed: int, args, sweep_dir: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "run.py"), "-m", "hparams_search=text_cls", "model=tiny", "data=demo",
            f"train.max_steps={args.steps}", "train.select_best=true", f"train.evals_per_epoch={args.evals_per_epoch}",
            f"train.batch_size={args.batch_size}", f"train.learning_rate={args.lr_range}", f"hparams_search.pruner={arm}",
            f"hparams_search.n_trials={args.trials}", f"hydra.sweeper.sampler.seed={seed}", "save_model=false",
            f"hydra.sweep.dir={sweep_dir}", f"cache_dir={args.cache_dir}", *(SMOKE_OVERRIDES if args.smoke else [])]


def read_sweep(sweep_dir: str) -> dict:
    """The study's trials and the steps each trained (results.json: a pruned trial's stop, else max_steps)."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="text_cls-tiny-finetune", storage=f"sqlite:///{sweep_dir}/optuna.db")
    steps = 0
    for root, _, files in os.walk(sweep_dir):
        if "results.json" in files:
            with open(os.path.join(root, "results.json"), encoding="utf-8") as f:
                r = json.load(f)
            steps += r["pruned"]["step"] if r.get("pruned") else int(r["config"]["train"]["max_steps"])
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    return {"finished": len(finished), "pruned": sum(t.state == TrialState.PRUNED for t in study.trials),
            "failed": sum(t.state == TrialState.FAIL for t in study.trials), "steps": steps,
            "best": max((t.value for t in finished), default=math.nan),
            "pruned_at": sorted(max(t.intermediate_values) for t in study.trials if t.state == TrialState.PRUNED)}


def run_sweep(arm: str, seed: int, args) -> dict:
    sweep_dir = os.path.join(args.out, f"{arm}_seed{seed}")
    timing = os.path.join(sweep_dir, "wall_s.json")
    if os.path.exists(timing):  # finished earlier: its study is complete
        with open(timing, encoding="utf-8") as f:
            wall = json.load(f)["wall_s"]
    else:
        started = time.perf_counter()
        proc = subprocess.run(sweep_command(arm, seed, args, sweep_dir), cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, KOTUNE_PROGRESS="0"))
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"sweep {arm} seed {seed} failed:\n{proc.stderr[-3000:]}")
        with open(timing, "w", encoding="utf-8") as f:
            json.dump({"wall_s": wall}, f)
    return {"arm": arm, "seed": seed, "wall_s": wall, **read_sweep(sweep_dir)}


def paired(diffs: list[float]) -> tuple[float, float, bool]:
    mean = statistics.mean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return mean, se, len(diffs) > 1 and abs(mean) > 2 * se


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300, help="train.max_steps of every trial")
    parser.add_argument("--evals-per-epoch", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr-range", default="tag(log, interval(3e-4, 3e-3))", help="train.learning_rate's range")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the sampler's seeds (one pair each)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_sweep_pruning"))
    parser.add_argument("--cache-dir", default=None, help="tokenizer/feature cache (default OUT/cache)")
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, SMOKE, argv)
    args.out = os.path.abspath(args.out)
    args.cache_dir = args.cache_dir or os.path.join(args.out, "cache")
    os.makedirs(args.out, exist_ok=True)
    print(f"{args.trials} trials × {args.steps} steps of model=tiny on data=demo (batch {args.batch_size}, "
          f"{args.evals_per_epoch} evaluations per epoch), sampler seeds {args.seeds}; {os.cpu_count()} CPUs, "
          f"torch threads default", flush=True)
    rows = []
    for seed in args.seeds:
        for arm in ARMS:
            rows.append(run_sweep(arm, seed, args))
            r = rows[-1]
            print(f"  pruner={arm:<6} seed {seed}: {r['wall_s']:7.1f} s, {r['steps']:6d} steps, "
                  f"{r['finished']} finished / {r['pruned']} pruned / {r['failed']} failed, best {r['best']:.2f}",
                  flush=True)
    by = {(r["arm"], r["seed"]): r for r in rows}
    wall = [by[("none", s)]["wall_s"] / by[("median", s)]["wall_s"] for s in args.seeds]
    steps = [by[("none", s)]["steps"] / by[("median", s)]["steps"] for s in args.seeds]
    diff, se, shown = paired([by[("median", s)]["best"] - by[("none", s)]["best"] for s in args.seeds])
    print(f"\nwall time none/median: {statistics.mean(wall):.2f}× (per seed {', '.join(f'{x:.2f}' for x in wall)}); "
          f"steps trained none/median: {statistics.mean(steps):.2f}×")
    print(f"best dev macro F1, median − none: {diff:+.2f} ± {se:.2f} (SE over {len(args.seeds)} seeds): "
          + ("shown" if shown else "not shown (inside 2 SE)"))
    summary = {"args": {k: v for k, v in vars(args).items()}, "sweeps": rows, "wall_ratio": wall, "steps_ratio": steps,
               "best_diff": diff, "best_diff_se": se, "shown": shown}
    tmp = os.path.join(args.out, "sweep_pruning.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(args.out, "sweep_pruning.json"))
    print(f"RESULT sweep_pruning_wall_ratio={statistics.mean(wall):.2f} steps_ratio={statistics.mean(steps):.2f} "
          f"best_diff={diff:+.2f} se={se:.2f} shown={shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
