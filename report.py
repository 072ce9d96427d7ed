"""Leaderboard of kotune runs: ``python report.py DIR... [--out DIR] [--paper]``.

Collects every results.json under the directories (matrices, sweeps, single runs) and writes
``leaderboard.md``, ``leaderboard.csv`` and PNG plots into ``--out`` (default: the first DIR):

- rows are model × mode (× the settings that differ between runs, for a sweep), columns each
  task's metrics as mean ± std over seeds with n, failed runs counted separately; the folds of a
  cross-validation (``data.folds=K``, ``-m data.fold=0,...,K-1``) are averaged like seeds, so K folds
  give one row (runs with and without ``data.folds`` are different rows), and a row missing a
  fold says so;
- ``plot_<task>.png``: the task's main metric per row, bars with ±std error bars and the seeds
  as dots; ``sweep_<task>_<model>_<mode>.png``: the main metric against each hyperparameter that
  varies across a sweep's runs;
- ``--paper``: the published KLUE baseline scores (kotune_data/klue_paper.csv) and the delta to each,
  and per row and task whether the runs match the published setup ("like for like") or which
  settings differ: the task's ``reference:`` block as the run stored it in its config
  (``task.reference.task`` / ``.train``: marker scheme, pooling, POS, recipe, selection,
  max_length), the paper's model (its hub id, pretrained) and KLUE's own data, trained by epochs.

Unreadable, partial or foreign results.json files are skipped with a warning naming the file.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterable

import kotune_data

ROOT = Path(__file__).resolve().parent
PAPER_FILE = Path(kotune_data.data_path("klue_paper.csv"))
TASK_CONF = ROOT / "conf" / "task"
# Config keys that identify the row/column (task, model, mode), the seed (averaged over) or that
# do not change a result: none of them makes two runs different settings.
NOT_SETTINGS = ("task", "data", "cache_dir", "checkpoint", "save_model", "save_predictions", "action",
                "train.seed", "model.name", "mode.name", "train.eval_batch_size", "train.logging_steps",
                "train.dataloader_num_workers", "train.save_strategy", "train.eval_strategy")
CORRELATIONS = ("pearson", "spearman")
# The paper's rows (kotune_data/klue_paper.csv names them by kotune preset) are these checkpoints
PAPER_MODELS = {"klue": "klue/bert-base", "klue-roberta": "klue/roberta-base",
                "koelectra": "monologg/koelectra-base-v3-discriminator"}
# What every published row shares: pretrained weights fine-tuned by epochs on KLUE's own train and
# dev splits (the hub's klue/klue), whole
PAPER_PROTOCOL = {"model.init": "pretrained", "train.max_steps": -1, "data.source": "hub",
                  "data.train_file": None, "data.validation_file": None, "data.validation_split": 0.0,
                  "data.max_train_samples": None, "data.max_eval_samples": None}
# ...except these: runs cut into folds differently (or not at all) are different settings; the fold
# itself (data.fold) is averaged over, as a seed is
DATA_SETTINGS = ("data.folds",)
LIKE_FOR_LIKE = "like for like"
UNKNOWN_SETUP = "not comparable: no task.reference in the run's config (a run from before references)"
MAX_BARS = 15


def warn(msg: str) -> None:
    print(f"report: warning: {msg}", file=sys.stderr, flush=True)


# ---- reading -------------------------------------------------------------------------------
def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{'train': {'seed': 1}} → {'train.seed': 1}; lists stay values."""
    if not isinstance(node, dict):
        return {prefix[:-1]: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def task_main_metric(task: str) -> str | None:
    """The task's main metric from conf/task/<task>.yaml, for results that do not name it."""
    from omegaconf import OmegaConf

    path = TASK_CONF / f"{task}.yaml"
    return OmegaConf.load(path).get("main_metric") if path.exists() else None


def read_run(path: Path) -> dict | None:
    """One results.json as a normalised run, or None (with a warning naming the file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        warn(f"skipping {path}: unreadable or corrupt JSON ({e})")
        return None
    if not isinstance(data, dict):
        warn(f"skipping {path}: not a kotune results file (a JSON {type(data).__name__})")
        return None
    missing = [k for k in ("task", "model") if not isinstance(data.get(k), str)]
    if missing:
        warn(f"skipping {path}: not a kotune results file (no {', '.join(missing)})")
        return None
    if data.get("action", "train") not in ("train", "eval"):
        return None  # predict / ceiling runs: no model score to rank
    metrics = {k: float(v) for k, v in (data.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    status = data.get("status", "ok" if metrics else None)  # early results had no status
    if status not in ("ok", "failed", "pruned"):  # pruned: a sweep's trial stopped early (kotune/pruning.py)
        warn(f"skipping {path}: partial run (status {status!r})")
        return None
    if status == "ok" and not metrics:
        warn(f"skipping {path}: status ok but no metrics")
        return None
    main_metric = data.get("main_metric") or task_main_metric(data["task"]) or (sorted(metrics) or [None])[0]
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    return {
        "task": data["task"], "model": data["model"], "mode": str(data.get("mode", "-")),
        "seed": data.get("seed"), "status": status, "metrics": metrics, "main_metric": main_metric,
        "main_score": metrics.get(main_metric) if status == "ok" else None,
        "error": data.get("error"), "config_hash": data.get("config_hash"), "config": config,
        "flat_config": flatten(config), "path": str(path), "run_dir": str(path.parent),
        "mtime": path.stat().st_mtime,
    }


def collect_runs(dirs: Iterable[str], quiet: bool = False) -> list[dict]:
    """Every readable run under ``dirs``; a config hash seen twice (overlapping directories, a
    copied run) counts once: the ok run, else the newest."""
    runs: list[dict] = []
    for d in dirs:
        for path in sorted(Path(d).rglob("results.json")):
            run = read_run(path)
            if run is not None:
                runs.append(run)
    best: dict[str, dict] = {}
    unique = []
    for run in runs:
        h = run["config_hash"]
        if not h:
            unique.append(run)
            continue
        kept = best.get(h)
        if kept is None or (run["status"] == "ok", run["mtime"]) > (kept["status"] == "ok", kept["mtime"]):
            best[h] = run
    dropped = len(runs) - len(unique) - len(best)
    if dropped and not quiet:
        print(f"report: {dropped} duplicate run(s) of the same config counted once", file=sys.stderr)
    return unique + list(best.values())


def varying_keys(runs: list[dict]) -> list[str]:
    """Settings (config keys) that differ between runs of the same task, among the keys all runs
    have: a value that only follows the task (its max_length, say) is not a setting."""
    if len(runs) < 2:
        return []
    common = set.intersection(*(set(r["flat_config"]) for r in runs))
    keys = [k for k in common if k in DATA_SETTINGS
            or not any(k == p or k.startswith(p + ".") for p in NOT_SETTINGS)]
    varying = set()
    for task in {r["task"] for r in runs}:
        same_task = [r for r in runs if r["task"] == task]
        varying |= {k for k in keys if len({json.dumps(r["flat_config"][k], sort_keys=True) for r in same_task}) > 1}
    return sorted(varying)


# ---- aggregation ---------------------------------------------------------------------------
def fmt_value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def assign_rows(runs: list[dict]) -> list[tuple]:
    """Gives each run its row key (model, mode, setting) and returns the keys in table order."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["mode"]), []).append(r)
    keys = []
    for (model, mode), members in sorted(groups.items()):
        varying = varying_keys(members)
        for r in members:
            r["setting"] = " ".join(f"{k.rsplit('.', 1)[-1]}={fmt_value(r['flat_config'][k])}" for k in varying)
            r["row"] = (model, mode, r["setting"])
        rows = sorted(sorted({r["row"] for r in members}), key=lambda row: -row_score(members, row))
        keys += rows
    return keys


def missing_folds(runs: list[dict], rows: list[tuple]) -> list[str]:
    """Cross-validation rows whose runs do not cover every fold (per seed): one line each."""
    lines = []
    for row in rows:
        for task in sorted({r["task"] for r in runs}):
            ran: dict[tuple, set] = {}
            for r in runs:
                folds = r["flat_config"].get("data.folds")
                if r["row"] == row and r["task"] == task and r["status"] == "ok" and folds:
                    ran.setdefault((r["seed"], folds, r["flat_config"].get("data.fold_seed")), set()).add(
                        r["flat_config"].get("data.fold"))
            for (seed, folds, _), got in sorted(ran.items(), key=str):
                if got != set(range(folds)):
                    lines.append(f"{' / '.join(x for x in row if x)}, {task}, seed {seed}: folds "
                                 f"{', '.join(str(f) for f in sorted(got, key=str))} of {folds} ran ok")
    return lines


def row_score(runs: list[dict], row: tuple) -> float:
    """Mean main score of a row's runs (orders a sweep's settings best first)."""
    scores = [r["main_score"] for r in runs if r["row"] == row and r["main_score"] is not None]
    return statistics.fmean(scores) if scores else -math.inf


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def aggregate(runs: list[dict]) -> tuple[list[tuple], list[tuple[str, str]], dict]:
    """Rows, columns (task, metric) and cells {(row, task, metric): (mean, std, n)} plus
    {(row, task, 'failed'): count}."""
    rows = assign_rows(runs)
    tasks = sorted({r["task"] for r in runs})
    columns = []
    for task in tasks:
        main = next((r["main_metric"] for r in runs if r["task"] == task and r["main_metric"]), None)
        # a task whose runs all failed keeps its main metric's column (empty) and its failed count
        names = sorted({m for r in runs if r["task"] == task for m in r["metrics"]}) or [main or "?"]
        columns += [(task, m) for m in sorted(names, key=lambda m: (m != main, m))]
    cells: dict = {}
    for row in rows:
        for task in tasks:
            mine = [r for r in runs if r["row"] == row and r["task"] == task]
            cells[(row, task, "failed")] = sum(r["status"] == "failed" for r in mine)
            for t, metric in columns:
                if t == task:
                    vals = [r["metrics"][metric] for r in mine if r["status"] == "ok" and metric in r["metrics"]]
                    cells[(row, task, metric)] = (*mean_std(vals), len(vals))
    return rows, columns, cells


def read_paper(path: Path) -> dict[tuple[str, str, str], float]:
    """{(model, task, metric): value} from the published-numbers CSV ('#' lines are comments)."""
    if not path.exists():
        raise SystemExit(f"report: --paper needs {path} (model,task,metric,value rows)")
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if line.strip() and not line.startswith("#")))
    out = {}
    for i, row in enumerate(rows, 1):
        try:
            out[(row["model"], row["task"], row["metric"])] = float(row["value"])
        except (KeyError, TypeError, ValueError):
            warn(f"{path}: data row {i}: expected model,task,metric,value with a number, got {row}")
    return out


def with_presets(paper: dict, runs: list[dict]) -> dict:
    """A task preset (``task=dp_klue``: ``kind: dp``) is compared with its task's published numbers."""
    kinds = {r["task"]: (r["config"].get("task") or {}).get("kind") for r in runs}
    aliases = {(model, task, metric): value for task, kind in kinds.items() if kind and kind != task
               for (model, t, metric), value in paper.items() if t == kind}
    return {**paper, **aliases}


def paper_value(paper: dict, row: tuple, task: str, metric: str) -> float | None:
    model, mode, _ = row
    return paper.get((model, task, metric)) if mode == "finetune" else None  # the paper fine-tunes


def setup_differences(run: dict) -> list[str] | None:
    """How a run's setup differs from the published baseline's for its task, as ``key ours≠paper``
    strings (empty: like for like); None when the run's config holds no ``task.reference`` block.
    The reference is the one the run stored (its resolved config), never today's yaml."""
    reference = (run["config"].get("task") or {}).get("reference")
    if not isinstance(reference, dict):
        return None
    config = run["flat_config"]
    wanted: dict[str, Any] = {f"{group}.{key}": value for group in ("task", "train")
                              for key, value in (reference.get(group) or {}).items()}
    wanted.update(PAPER_PROTOCOL)
    diffs = [f"{key} {fmt_setting(config.get(key))}≠{fmt_setting(value)}" for key, value in wanted.items()
             if not same_setting(config.get(key), value)]
    paper_model = PAPER_MODELS.get(run["model"])
    ours = config.get("model.name_or_path")
    if paper_model and ours != paper_model:
        diffs.append(f"model {ours or run['model']}≠{paper_model}")
    return diffs


def same_setting(ours: Any, paper: Any) -> bool:
    if isinstance(ours, (int, float)) and isinstance(paper, (int, float)) and not isinstance(ours, bool) \
            and not isinstance(paper, bool):
        return math.isclose(ours, paper, rel_tol=1e-9)
    return ours == paper


def fmt_setting(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, type(None))) else fmt_value(value)


def setup_text(runs: list[dict], row: tuple, task: str) -> str:
    """The row's runs of ``task`` against the published setup: like for like, the differing
    settings (over all its runs), or why nothing can be compared."""
    mine = [r for r in runs if r["row"] == row and r["task"] == task]
    if not mine:
        return "–"
    found = [setup_differences(r) for r in mine]
    if any(d is None for d in found):
        return UNKNOWN_SETUP
    diffs = sorted({d for ds in found for d in ds})
    return "; ".join(diffs) if diffs else LIKE_FOR_LIKE


def setup_column(paper: dict | None, columns: list[tuple[str, str]], task: str, metric: str) -> bool:
    """The task's setup column follows its first column with a published number."""
    return with_paper(paper, task, metric) and next(m for t, m in columns if t == task and with_paper(paper, t, m)) == metric


def with_paper(paper: dict | None, task: str, metric: str) -> bool:
    """Whether the (task, metric) column gets paper and Δ columns: the table has a number for it."""
    return paper is not None and any(t == task and m == metric for _, t, m in paper)


# ---- writing -------------------------------------------------------------------------------
def cell_text(mean: float | None, std: float | None, n: int) -> str:
    if mean is None:
        return "–"
    return f"{mean:.2f} ± {std:.2f} ({n})" if std is not None else f"{mean:.2f} ({n})"


def has_settings(rows: list[tuple]) -> bool:
    return any(row[2] for row in rows)


def leaderboard_markdown(runs: list[dict], rows, columns, cells, paper: dict | None, dirs: list[str],
                         paper_file: str = "") -> str:
    n_ok = sum(r["status"] == "ok" for r in runs)
    n_pruned = sum(r["status"] == "pruned" for r in runs)
    n_failed = len(runs) - n_ok - n_pruned
    main = {r["task"]: r["main_metric"] for r in runs}
    head = ["model", "mode"] + (["setting"] if has_settings(rows) else [])
    for task, metric in columns:
        head.append(f"{task} {metric}{'*' if main.get(task) == metric else ''}")
        if with_paper(paper, task, metric):
            head += [f"{task} {metric} (paper)", "Δ"]
        if setup_column(paper, columns, task, metric):
            head.append(f"{task} setup vs paper")
    head.append("failed")
    lines = [
        "# kotune leaderboard", "",
        f"{len(runs)} runs under {', '.join(dirs)}: {n_ok} ok, "
        + (f"{n_pruned} pruned (sweep trials stopped early, not in the cells), " if n_pruned else "")
        + f"{n_failed} failed. Cells: mean ± std over "
        "seeds (n ok runs), metrics ×100 on the validation split; * marks the task's main metric."
        + (" Cross-validation runs (data.folds): over folds and seeds, each fold's held-out part its validation "
           "split." if any(r["flat_config"].get("data.folds") for r in runs) else ""),
    ]
    if paper is not None:
        lines.append(f"Paper: published KLUE baseline scores from {paper_file} (fine-tuning rows only); "
                     "Δ = ours − paper. \"setup vs paper\": like for like, or the settings that differ "
                     "(ours≠paper; listed under the table).")
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tasks = sorted({t for t, _ in columns})
    setups = paper_setups(runs, rows, columns, paper)
    for row in rows:
        out = [row[0], row[1]] + ([row[2] or "–"] if has_settings(rows) else [])
        for task, metric in columns:
            mean, std, n = cells[(row, task, metric)]
            out.append(cell_text(mean, std, n))
            if with_paper(paper, task, metric):
                ref = paper_value(paper, row, task, metric)
                out += ["–" if ref is None else f"{ref:.2f}",
                        "–" if ref is None or mean is None else f"{mean - ref:+.2f}"]
            if setup_column(paper, columns, task, metric):
                setup = setups.get((row, task), "–")
                out.append(setup if setup in ("–", LIKE_FOR_LIKE) else
                           "unknown (below)" if setup == UNKNOWN_SETUP else "differs (below)")
        failed = [f"{cells[(row, t, 'failed')]} {t}" for t in tasks if cells[(row, t, "failed")]]
        out.append(", ".join(failed) or "0")
        lines.append("| " + " | ".join(out) + " |")
    unlike = {k: v for k, v in setups.items() if v not in ("–", LIKE_FOR_LIKE)}
    if unlike:
        lines += ["", "## Setup differences from the paper", "",
                  "Rows whose Δ compares unlike setups (ours≠paper), or setups that cannot be compared:", ""]
        for (row, task), text in unlike.items():
            lines.append(f"- {' / '.join(x for x in row if x)}, {task}: {text}")
    incomplete = missing_folds(runs, rows)
    if incomplete:
        lines += ["", "## Incomplete cross-validation", "",
                  "These rows average fewer folds than their data.folds: their mean is not a K-fold estimate.", ""]
        lines += [f"- {line}" for line in incomplete]
    failed_runs = [r for r in runs if r["status"] == "failed"]
    if failed_runs:
        lines += ["", "## Failed runs", "", "| task | model | mode | seed | error | results |", "|---|---|---|---|---|---|"]
        for r in sorted(failed_runs, key=lambda r: r["path"]):
            error = (r["error"] or "?").replace("|", "\\|").replace("\n", " ")
            error = error if len(error) <= 160 else error[:157] + "..."
            lines.append(f"| {r['task']} | {r['model']} | {r['mode']} | {r['seed']} | {error} | {r['path']} |")
    return "\n".join(lines) + "\n"


def paper_setups(runs: list[dict], rows, columns, paper: dict | None) -> dict[tuple, str]:
    """{(row, task): setup text} where the row shows a published number for the task."""
    out = {}
    for row in rows:
        for task, metric in columns:
            if setup_column(paper, columns, task, metric) and any(
                    paper_value(paper, row, task, m) is not None for t, m in columns if t == task):
                out[(row, task)] = setup_text(runs, row, task)
    return out


def write_csv(path: Path, runs: list[dict], rows, columns, cells, paper: dict | None) -> None:
    tasks = sorted({t for t, _ in columns})
    setups = paper_setups(runs, rows, columns, paper)
    head = ["model", "mode", "setting"]
    for task, metric in columns:
        head += [f"{task}.{metric}.mean", f"{task}.{metric}.std", f"{task}.{metric}.n"]
        if with_paper(paper, task, metric):
            head += [f"{task}.{metric}.paper", f"{task}.{metric}.delta"]
        if setup_column(paper, columns, task, metric):
            head.append(f"{task}.paper_setup")
    head += [f"{t}.failed" for t in tasks]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(head)
        for row in rows:
            out: list[Any] = list(row)
            for task, metric in columns:
                mean, std, n = cells[(row, task, metric)]
                out += ["" if mean is None else round(mean, 4), "" if std is None else round(std, 4), n]
                if with_paper(paper, task, metric):
                    ref = paper_value(paper, row, task, metric)
                    out += ["" if ref is None else ref, "" if ref is None or mean is None else round(mean - ref, 4)]
                if setup_column(paper, columns, task, metric):
                    out.append(setups.get((row, task), ""))
            out += [cells[(row, t, "failed")] for t in tasks]
            w.writerow(out)


# ---- plots ---------------------------------------------------------------------------------
def metric_label(metric: str) -> str:
    return f"{metric} (r × 100)" if metric in CORRELATIONS else f"{metric} (%)"


def row_label(row: tuple) -> str:
    model, mode, setting = row
    return f"{model} / {mode}" + ("\n" + textwrap.fill(setting, 44) if setting else "")


def plot_task(path: Path, task: str, runs: list[dict], rows: list[tuple], paper: dict | None) -> None:
    """Horizontal bars: the task's main metric per row (mean, ±std error bar, seeds as dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in runs if r["task"] == task]
    metric = next(r["main_metric"] for r in mine)
    rows = [row for row in rows if any(r["row"] == row for r in mine)]
    shown = rows[:MAX_BARS]  # a long sweep: its best settings (rows are ordered best first)
    lines = sum(row_label(row).count("\n") + 1 for row in shown)
    fig, ax = plt.subplots(figsize=(11 if has_settings(shown) else 8.5, 1.4 + 0.22 * lines + 0.3 * len(shown)))
    for y, row in enumerate(shown):
        scores = [r["main_score"] for r in mine if r["row"] == row and r["main_score"] is not None]
        failed = sum(r["status"] == "failed" for r in mine if r["row"] == row)
        mean, std = mean_std(scores)
        if mean is not None:
            ax.barh(y, mean, xerr=std or 0.0, color="#4C72B0", alpha=0.85, capsize=5, height=0.6)
            ax.scatter(scores, [y] * len(scores), color="black", s=14, zorder=3)
        note = cell_text(mean, std, len(scores)).replace("(", "(n=") if scores else "no ok run"
        note += f", {failed} failed" if failed else ""
        right = max(0.0, (mean or 0) + (std or 0), max(scores, default=0))
        ax.text(right + 1.5, y, note, va="center", fontsize=9)
        ref = paper_value(paper, row, task, metric) if paper else None
        if ref is not None:
            labelled = any(line.get_label() == "KLUE published" for line in ax.lines)
            ax.plot([ref, ref], [y - 0.4, y + 0.4], color="#C44E52", lw=2.5,
                    label=None if labelled else "KLUE published")
    ax.set_yticks(range(len(shown)), [row_label(row) for row in shown], fontsize=8 if has_settings(shown) else 9)
    ax.invert_yaxis()
    values = [r["main_score"] for r in mine if r["main_score"] is not None]
    ax.set_xlim(min(0.0, min(values, default=0.0) - 5), 118)  # room for the labels on the right
    ax.set_xlabel(f"{metric_label(metric)} on the validation split")
    more = f" (best {len(shown)} of {len(rows)} settings)" if len(shown) < len(rows) else ""
    ax.set_title(f"{task}: {metric}, mean ± std over seeds (bars), one dot per run{more}", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(path: Path, runs: list[dict], keys: list[str]) -> None:
    """Main metric against each varying setting; the best run starred, pruned trials hollow (their
    best score before the stop), failed runs as red x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r0 = runs[0]
    metric = r0["main_metric"]
    ok = [r for r in runs if r["main_score"] is not None]
    failed = [r for r in runs if r["status"] == "failed"]
    pruned = [r for r in runs if r["status"] == "pruned" and metric in r["metrics"]]
    best = max(ok, key=lambda r: r["main_score"]) if ok else None
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows), squeeze=False)
    low = min((r["main_score"] for r in ok), default=0.0)
    for ax, key in zip(axes.flat, keys):
        values = [r["flat_config"][key] for r in runs]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric:
            def xpos(r):
                return r["flat_config"][key]
            if all(v > 0 for v in values) and ("learning_rate" in key or max(values) / min(values) >= 50):
                ax.set_xscale("log")  # searched on a log scale (tag(log, ...)) or spanning decades
        else:
            cats = sorted({json.dumps(v) for v in values})

            def xpos(r):
                return cats.index(json.dumps(r["flat_config"][key]))
            ax.set_xticks(range(len(cats)), [c.strip('"') for c in cats], rotation=20, fontsize=8)
        ax.scatter([xpos(r) for r in ok], [r["main_score"] for r in ok], color="#4C72B0", s=30, label="trial")
        if pruned:
            ax.scatter([xpos(r) for r in pruned], [r["metrics"][metric] for r in pruned], facecolors="none",
                       edgecolors="#8C8C8C", s=30, label="pruned")
        if failed:
            ax.scatter([xpos(r) for r in failed], [low] * len(failed), color="#C44E52", marker="x", s=40,
                       label="failed")
        if best is not None:
            ax.scatter([xpos(best)], [best["main_score"]], color="#DD8452", marker="*", s=180, zorder=3,
                       label="best")
        ax.set_xlabel(key)
        ax.set_ylabel(metric_label(metric))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{r0['task']} / {r0['model']} / {r0['mode']}: {metric} per trial "
                 f"({len(ok)} ok, {len(pruned)} pruned, {len(failed)} failed)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(out: Path, runs: list[dict], rows: list[tuple], paper: dict | None) -> list[Path]:
    written = []
    for task in sorted({r["task"] for r in runs}):
        if any(r["main_score"] is not None for r in runs if r["task"] == task):
            written.append(out / f"plot_{task}.png")
            plot_task(written[-1], task, runs, rows, paper)
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["model"], r["mode"]), []).append(r)
    for (task, model, mode), members in sorted(groups.items()):
        keys = varying_keys(members)
        if keys and any(r["main_score"] is not None for r in members):
            written.append(out / f"sweep_{task}_{model}_{mode}.png")
            plot_sweep(written[-1], members, keys)
    return written


# ---- command line --------------------------------------------------------------------------
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


if __name__ == "__main__":
    sys.exit(main())
