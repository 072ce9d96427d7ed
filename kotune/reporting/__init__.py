"""Leaderboard of kotune runs: ``python report.py DIR... [--out DIR] [--paper]``

Collects every results.json under the directories (matrices, sweeps, single runs) and writes
``leaderboard.md``, ``leaderboard.csv`` and PNG plots into ``--out`` (default: the first DIR):

- rows are model × mode (× the settings that differ between runs, for a sweep), columns each
  task's metrics as mean ± std over seeds with n, failed runs counted separately; the folds of a
  cross-validation (``data.folds=K``, ``-m data.fold=0,...,K-1``) are averaged like seeds, so K folds
  give one row (runs with and without ``data.folds`` are different rows), and a row missing a
  fold says so;
- ``plot_<task>.png``: the task's main metric per row, bars with ±std error bars and the seeds
  as dots; ``sweep_<task>_<model>_<mode>.png``: the main metric against each hyperparameter that
  varies across a sweep's runs; ``reliability_<task>_<model>_<mode>.png``: a row of calibrated
  runs' (train.calibrate) reliability bins before and after, pooled over its seeds;
- ``--paper``: the published KLUE baseline scores (kotune_data/klue_paper.csv) and the delta to each,
  and per row and task whether the runs match the published setup ("like for like") or which
  settings differ: the task's ``reference:`` block as the run stored it in its config
  (``task.reference.task`` / ``.train``: marker scheme, pooling, POS, recipe, selection,
  max_length), the paper's model (its hub id, pretrained) and KLUE's own data, trained by epochs.

Unreadable, partial or foreign results.json files are skipped with a warning naming the file.
``kotune report DIR...`` (the console command, kotune/cli/console.py) runs the same :func:`main`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import kotune_data
from kotune.reporting.paper import read_paper, with_paper, with_presets
from kotune.reporting.plots import plot_all
from kotune.reporting.runs import aggregate, collect_runs, varying_keys, warn
from kotune.reporting.tables import leaderboard_markdown, write_csv

__all__ = ["collect_runs", "main", "varying_keys"]
PAPER_FILE = Path(kotune_data.data_path("klue_paper.csv"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="directories holding results.json files")
    parser.add_argument("--out", help="where to write the leaderboard and plots (default: the first DIR)")
    parser.add_argument("--paper", action="store_true", help="add the published KLUE baseline scores and deltas")
    parser.add_argument("--paper-file", default=str(PAPER_FILE), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not os.path.isdir(d):
            print(f"report: {d} is not a directory", file=sys.stderr)
            return 1
    runs = collect_runs(args.dirs)
    if not runs:
        print(f"report: no runs found: no readable results.json under {', '.join(args.dirs)} "
              "(a run writes one when it ends)", file=sys.stderr)
        return 1
    paper = with_presets(read_paper(Path(args.paper_file)), runs) if args.paper else None
    if paper is not None and not any(with_paper(paper, r["task"], m) for r in runs for m in r["metrics"]):
        warn(f"{args.paper_file} has no published number for these tasks' metrics: no paper columns")
    out = Path(args.out or args.dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    rows, columns, cells = aggregate(runs)
    md = leaderboard_markdown(runs, rows, columns, cells, paper, args.dirs, args.paper_file)
    (out / "leaderboard.md").write_text(md, encoding="utf-8")
    write_csv(out / "leaderboard.csv", runs, rows, columns, cells, paper)
    plots = plot_all(out, runs, rows, paper)
    print(md)
    print(f"wrote {out / 'leaderboard.md'}, {out / 'leaderboard.csv'} and {len(plots)} plot(s): "
          + ", ".join(p.name for p in plots))
    return 0

