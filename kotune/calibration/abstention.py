"""``predict.min_confidence``: abstention for single-label classification (sequence and pair heads,
RE). A prediction whose top probability is under the threshold is answered "abstain": its
predictions.jsonl record (and the server's answer) keeps the model's label as ``model_prediction``
and its probabilities, says ``"prediction": "abstain"`` and ``"abstained": true`` (every record has
``abstained`` once the option is set); results.json's ``abstention`` entry holds the threshold, the
coverage, accuracy and the task's metrics on the answered rows, the risk–coverage curve and
``risk_coverage.png``. Other tasks refuse the option in one line (``Task.abstention_refusal``).
The curve and coverage are pure functions in tasks/abstention.py; docs/abstention.md."""
from __future__ import annotations

import os
from typing import Any

from tasks.abstention import abstains, area_under_curve, coverage, risk, risk_coverage_curve, thin

PLOT = "risk_coverage.png"
REPORT_FIELDS = ("min_confidence", "n", "answered", "coverage", "accuracy", "risk", "metrics", "aurc", "curve",
                 "plot")


def report(p: float | None, task, outputs: list[Any], examples: list[dict], scored: bool,
           run_dir: str | None) -> dict | None:
    """results.json's ``abstention`` under the threshold ``p`` (``Built.min_confidence``; None: off,
    and so is the entry): every field always present, None where it does not apply (no gold
    labels: no accuracy, curve or plot)."""
    if p is None:
        return None
    top = task.top_predictions(outputs)
    flags = abstains([conf for _, conf in top], p)
    entry: dict[str, Any] = dict.fromkeys(REPORT_FIELDS)
    entry.update(min_confidence=p, n=len(flags), answered=sum(not f for f in flags), coverage=coverage(flags))
    if not scored or not all("label" in ex for ex in examples):
        return entry
    correct = [label == str(ex["label"]) for (label, _), ex in zip(top, examples)]
    entry["risk"] = risk(correct, flags)
    entry["accuracy"] = None if entry["risk"] is None else 100.0 * (1.0 - entry["risk"])  # ×100, as metrics
    kept = [i for i, f in enumerate(flags) if not f]
    if kept:
        entry["metrics"] = task.score([outputs[i] for i in kept], [examples[i] for i in kept])
    curve = risk_coverage_curve([conf for _, conf in top], correct)
    entry["aurc"] = area_under_curve(curve)
    entry["curve"] = thin(curve)
    if run_dir is not None and curve:
        entry["plot"] = write_plot(os.path.join(run_dir, PLOT), curve, entry, task.name)
    return entry


def write_plot(path: str, curve: list[dict], entry: dict, title: str) -> str:
    """The risk–coverage curve as a PNG (a temporary file, then a rename); the threshold's point marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.step([c["coverage"] for c in curve], [c["risk"] for c in curve], where="post", color="#4C72B0")
    if entry["risk"] is not None:
        ax.scatter([entry["coverage"]], [entry["risk"]], color="#C44E52", zorder=3,
                   label=f"min_confidence={entry['min_confidence']:g}: coverage {entry['coverage']:.2f}, "
                         f"risk {entry['risk']:.2f}")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, max(0.05, max(c["risk"] for c in curve) * 1.1))
    ax.set_xlabel("coverage (share answered)")
    ax.set_ylabel("risk (error rate of the answered)")
    ax.set_title(f"{title}: risk–coverage (AURC {entry['aurc']:.3f})", fontsize=10)
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}"
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
