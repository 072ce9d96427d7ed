"""The leaderboard's tables: ``leaderboard.md`` (with its notes on setups, incomplete
cross-validation and failed runs) and ``leaderboard.csv``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kotune.core.files import write_csv_atomic
from kotune.reporting.paper import (LIKE_FOR_LIKE, UNKNOWN_SETUP, paper_setups, paper_value, setup_column,
                                    with_paper)
from kotune.reporting.runs import missing_folds


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
    table = []
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
        table.append(out)
    write_csv_atomic(str(path), head, table)  # model names and settings: text a spreadsheet must not run
