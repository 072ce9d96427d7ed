"""The leaderboard's plots: ``plot_<task>.png`` (a task's main metric per row),
``sweep_<task>_<model>_<mode>.png`` (the main metric against each setting a sweep varies) and
``reliability_<task>_<model>_<mode>.png`` (train.calibrate's bins before and after, pooled over a
row's seeds and folds)."""
from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

from kotune.reporting.paper import paper_value
from kotune.reporting.runs import mean_std, varying_keys
from kotune.reporting.tables import cell_text, has_settings

CORRELATIONS = ("pearson", "spearman")
MAX_BARS = 15


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
        written += plot_reliability(out, f"{task}_{model}_{mode}", members)
    return written


def plot_reliability(out: Path, name: str, runs: list[dict]) -> list[Path]:
    """One reliability diagram per row of calibrated runs (``reliability_<name>.png``, with the row's
    setting appended where a sweep varies one), their bins pooled over seeds; none without calibrated runs."""
    from kotune.calibration.fit import write_diagram
    from tasks.calibration_metrics import pooled_bins

    rows: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("reliability") and r["status"] == "ok":
            rows.setdefault(r.get("setting") or "", []).append(r)
    written = []
    for setting, members in sorted(rows.items()):
        if len({len(r["reliability"]["before"]) for r in members}) > 1:
            continue  # bins of different counts do not pool
        suffix = ("_" + re.sub(r"[^A-Za-z0-9.=-]+", "_", setting).replace("=", "-"))[:80] if setting else ""
        path = out / f"reliability_{name}{suffix}.png"
        before = pooled_bins([r["reliability"]["before"] for r in members])
        after = pooled_bins([r["reliability"]["after"] for r in members])
        title = f"{name.replace('_', ' / ')}{' ' + setting if setting else ''}: {len(members)} run(s) pooled, validation split"
        if write_diagram(str(path), before, after, title):
            written.append(path)
    return written
