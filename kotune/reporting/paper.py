"""The published KLUE baseline scores beside a leaderboard (``--paper``): the scores file, a row's
published number, and whether a row's runs match the published setup ("like for like") or which
settings differ."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from kotune.reporting.runs import fmt_value, warn

# The paper's rows (kotune_data/klue_paper.csv names them by kotune preset) are these checkpoints
PAPER_MODELS = {"klue": "klue/bert-base", "klue-roberta": "klue/roberta-base",
                "koelectra": "monologg/koelectra-base-v3-discriminator"}
# What every published row shares: pretrained weights fine-tuned by epochs on KLUE's own train and
# dev splits (the hub's klue/klue), whole
PAPER_PROTOCOL = {"model.init": "pretrained", "train.max_steps": -1, "data.source": "hub",
                  "data.train_file": None, "data.validation_file": None, "data.validation_split": 0.0,
                  "data.max_train_samples": None, "data.max_eval_samples": None}
LIKE_FOR_LIKE = "like for like"
UNKNOWN_SETUP = "not comparable: no task.reference in the run's config (a run from before references)"


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


def paper_setups(runs: list[dict], rows, columns, paper: dict | None) -> dict[tuple, str]:
    """{(row, task): setup text} where the row shows a published number for the task."""
    out = {}
    for row in rows:
        for task, metric in columns:
            if setup_column(paper, columns, task, metric) and any(
                    paper_value(paper, row, task, m) is not None for t, m in columns if t == task):
                out[(row, task)] = setup_text(runs, row, task)
    return out
