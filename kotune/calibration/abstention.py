"""``predict.min_confidence``: abstention for single-label classification (sequence and pair heads,
RE). A prediction whose top probability is under the threshold is answered "abstain": its
predictions.jsonl record (and the server's answer) keeps the model's label as ``model_prediction``
and its probabilities, says ``"prediction": "abstain"`` and ``"abstained": true`` (every record has
``abstained`` once the option is set); results.json's ``abstention`` entry holds the threshold, the
coverage, accuracy and the task's metrics on the answered rows, the risk–coverage curve and
``risk_coverage.png``. Other tasks refuse the option in one line (``Task.abstention_refusal``).
Which rows abstain, the entry and the curve are pure functions in tasks/abstention.py (``assess``); this
module draws the curve. docs/abstention.md."""
from __future__ import annotations

import os

PLOT = "risk_coverage.png"


def write_plot(run_dir: str, curve: list[dict], entry: dict, title: str) -> str:
    """The risk–coverage curve as ``run_dir``/risk_coverage.png (a temporary file, then a rename); the
    threshold's point marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = os.path.join(run_dir, PLOT)
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
