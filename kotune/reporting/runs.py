"""Reading and aggregating kotune runs for the leaderboard (kotune.reporting): every results.json
under some directories as a normalised run, the settings that differ between runs, and the table's
rows, columns and cells (mean ± std over seeds and folds, failed runs counted apart)."""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

from kotune.cli.config import CONF_DIR

TASK_CONF = Path(CONF_DIR) / "task"
# Config keys that identify the row/column (task, model, mode), the seed (averaged over) or that
# do not change a result: none of them makes two runs different settings.
NOT_SETTINGS = ("task", "data", "cache_dir", "checkpoint", "save_model", "save_predictions", "action",
                "train.seed", "model.name", "mode.name", "train.eval_batch_size", "train.logging_steps",
                "train.dataloader_num_workers", "train.save_strategy", "train.eval_strategy")
# ...except these: runs cut into folds differently (or not at all) are different settings; the fold
# itself (data.fold) is averaged over, as a seed is
DATA_SETTINGS = ("data.folds",)


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
    if data.get("action", "train") not in ("train", "eval", "distill"):  # distill: a student's training run
        return None  # predict / ceiling runs: no model score to rank
    metrics = {k: float(v) for k, v in (data.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    status = data.get("status", "ok" if metrics else None)  # early results had no status
    if status not in ("ok", "failed", "pruned"):  # pruned: a sweep's trial stopped early (kotune/sweeps/pruning.py)
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
        "mtime": path.stat().st_mtime, "reliability": reliability_of(data, path),
    }


def reliability_of(data: dict, path: Path) -> dict | None:
    """A calibrated run's reliability bins (results.json ``calibration.reliability``: before and
    after, each a list of equal-width bins), or None; bins of another shape are skipped with a warning."""
    entry = (data.get("calibration") or {}).get("reliability") if isinstance(data.get("calibration"), dict) else None
    if entry is None:
        return None

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def good_bin(b) -> bool:
        return (isinstance(b, dict) and all(number(b.get(k)) for k in ("lo", "hi", "count")) and b["count"] >= 0
                and all(number(b.get(k)) and 0 <= b[k] <= 1 if b["count"] else b.get(k) is None
                        for k in ("confidence", "accuracy")))

    sides = [entry.get(k) if isinstance(entry, dict) else None for k in ("before", "after")]
    if not all(isinstance(s, list) and s and all(good_bin(b) for b in s) for s in sides) or len(sides[0]) != len(sides[1]):
        warn(f"{path}: calibration.reliability is not a list of bins before and after: no reliability diagram from it")
        return None
    return {"before": sides[0], "after": sides[1]}


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
