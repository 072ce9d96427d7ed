"""``train.calibrate=temperature``: after training, fit a temperature (a softmax head: sequence,
pair, token, relation) or a Platt scaling per label (multi-label) on a seeded slice held out of the
training split (``train.calibrate_fraction``, tasks/splits.py: the ``calibrate`` split, never
trained on and never the split reported), fold it into the head's last linear layer
(heads/calibration.py) before the model is saved, and report in results.json ``calibration`` how
the probabilities on the validation split measured before and after (tasks/calibration_metrics.py),
with a reliability diagram (``reliability.png``) in the run directory.

Folded into the weights, the calibration travels with the model: predict, serve, the native and
ONNX exports and ``transformers.pipeline()`` give calibrated probabilities with no kotune code, and
the argmax (a multi-label task's decisions: its thresholds move with the scaling) is unchanged."""
from __future__ import annotations

import os

import numpy as np
from omegaconf import DictConfig

from kotune.core.errors import ConfigError
from kotune.core.log import log
from tasks.base import IGNORE

METHODS = ("temperature",)
SPLIT = "calibrate"  # the held-out slice's name among the splits (tasks/splits.py)
DIAGRAM = "reliability.png"
MIN_HELD_OUT = 30  # items to fit on (rows; a tagging task's tagged units): two per bin of the 15-bin ECE


def check_held_out(cfg: DictConfig, splits: dict) -> None:
    """A held-out slice too small to fit a calibration on is refused in one line, before training."""
    held = splits.get(SPLIT)
    items = sum(len(ex["tags"]) if isinstance(ex.get("tags"), list) else 1 for ex in held.examples) if held else 0
    if method(cfg) and held is not None and items < MIN_HELD_OUT:
        raise ConfigError(f"train.calibrate: the held-out slice has {items} items to fit on "
                          f"(train.calibrate_fraction={fraction(cfg)} of the training split); at least {MIN_HELD_OUT} "
                          "are needed (two per bin of the 15-bin ECE): raise train.calibrate_fraction or add data")


def method(cfg: DictConfig) -> str | None:
    """``train.calibrate`` checked: None or ``temperature``."""
    value = cfg.train.get("calibrate")
    if value in (None, False, "none", "null"):
        return None
    if value not in METHODS:
        raise ConfigError(f"train.calibrate={value}: expected null or {' | '.join(METHODS)}")
    return str(value)


def fraction(cfg: DictConfig) -> float:
    """The share of the training split held out to fit the calibration on (0 without one)."""
    return float(cfg.train.get("calibrate_fraction") or 0.1) if method(cfg) else 0.0


def check(cfg: DictConfig, model, splits: dict | None = None) -> None:
    """Refuse, in one line and before training, a head whose outputs are not class probabilities, and
    a held-out slice too small to fit on (:func:`check_held_out`)."""
    from heads.calibration import why_not_calibrated

    if not method(cfg):
        return
    if cfg.get("checkpoint") and not hasattr(model, "head"):
        raise ConfigError("train.calibrate: an ONNX export is not trained here; calibrate the kotune checkpoint")
    why = why_not_calibrated(model.head)
    if why:
        raise ConfigError(f"train.calibrate={method(cfg)} does not apply to the {model.head_description()} head: {why}")
    check_held_out(cfg, splits or {})


def _logits_and_labels(trainer, b, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The head's raw logits on ``split`` and its labels, one row per scored item (a token head's
    labelled slots; a multi-label row's labels cut to the task's)."""
    scoring, trainer.compute_metrics = trainer.compute_metrics, None
    try:
        out = trainer.predict(b.inputs[split])
    finally:
        trainer.compute_metrics = scoring
    logits = out.predictions[0] if isinstance(out.predictions, tuple) else out.predictions
    labels = out.label_ids[0] if isinstance(out.label_ids, tuple) else out.label_ids
    logits, labels = np.asarray(logits, dtype=np.float64), np.asarray(labels)
    if labels is None or logits.shape[0] != labels.shape[0]:
        raise ConfigError(f"train.calibrate: the {split} split's logits and labels do not line up "
                          f"({logits.shape} vs {None if labels is None else labels.shape})")
    k = logits.shape[-1]
    if b.model.head.probabilities == "sigmoid":
        return logits.reshape(-1, k), labels[..., :k].reshape(-1, k).astype(np.float64)
    logits, labels = logits.reshape(-1, k), labels.reshape(-1).astype(np.int64)
    if len(labels) != len(logits):  # token axes padded differently: read the real slots only
        raise ConfigError(f"train.calibrate: {len(logits)} logit rows but {len(labels)} labels on {split}")
    keep = labels != IGNORE
    return logits[keep], labels[keep]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _scores(probs_rows: list, labels: list) -> dict:
    from tasks.calibration_metrics import calibration_scores

    return calibration_scores(probs_rows, labels)


def calibrate(cfg: DictConfig, trainer, b, run_dir: str) -> dict | None:
    """Fit, fold and measure (see the module's docstring): the results' ``calibration`` entry."""
    import torch

    from heads.calibration import fit_platt, fit_temperature, fold_platt, fold_temperature
    from tasks.calibration_metrics import binary_rows, reliability_bins, softmax

    chosen = method(cfg)
    if not chosen or SPLIT not in b.splits:
        return None
    z_fit, y_fit = _logits_and_labels(trainer, b, SPLIT)
    z_val, y_val = _logits_and_labels(trainer, b, "validation")
    entry = {"method": None, "temperature": None, "platt": None, "held_out": len(b.splits[SPLIT].examples),
             "held_out_items": int(len(y_fit)), "fraction": fraction(cfg), "fit_on": "calibrate",
             "measured_on": "validation", "n_items": int(len(y_val)), "bins": 15}
    if b.model.head.probabilities == "sigmoid":
        scale, shift = fit_platt(torch.from_numpy(z_fit), torch.from_numpy(y_fit))
        a, c = np.asarray(scale), np.asarray(shift)
        before = _sigmoid(z_val).reshape(-1)
        after = _sigmoid(z_val * a + c).reshape(-1)
        gold = y_val.reshape(-1).astype(np.int64).tolist()
        rows_before, rows_after = binary_rows(before.tolist()), binary_rows(after.tolist())
        fold_platt(b.model.head, scale, shift)
        _move_thresholds(b.task, a, c)
        entry.update(method="platt", platt={name: {"a": float(x), "c": float(y)}
                                            for name, x, y in zip(b.task.labels, scale, shift)})
        log("Platt scaling per label fitted on " + f"{entry['held_out']} held-out training examples: " +
            ", ".join(f"{n} a={x:.3f} c={y:+.3f}" for n, x, y in zip(b.task.labels, scale, shift)))
    else:
        t = fit_temperature(torch.from_numpy(z_fit), torch.from_numpy(y_fit))
        gold = y_val.tolist()
        rows_before, rows_after = softmax(z_val.tolist()), softmax(z_val.tolist(), t)
        fold_temperature(b.model.head, t)
        entry.update(method="temperature", temperature=t)
        log(f"temperature {t:.4f} fitted on {entry['held_out']} held-out training examples "
            f"({entry['held_out_items']} items)")
    entry["before"], entry["after"] = _scores(rows_before, gold), _scores(rows_after, gold)
    b.model.meta["calibration"] = {k: entry[k] for k in ("method", "temperature", "platt", "held_out")}
    log(f"calibration on the validation split: ECE {entry['before']['ece']:.4f} → {entry['after']['ece']:.4f}, "
        f"NLL {entry['before']['nll']:.4f} → {entry['after']['nll']:.4f}")
    from kotune.devices import is_rank_zero

    # the bins stay in results.json: report.py pools them over a row's seeds into its own diagram
    entry["reliability"] = {"before": reliability_bins(rows_before, gold), "after": reliability_bins(rows_after, gold)}
    if is_rank_zero():
        entry["diagram"] = write_diagram(os.path.join(run_dir, DIAGRAM), entry["reliability"]["before"],
                                         entry["reliability"]["after"], diagram_title(entry))
    return entry


def diagram_title(entry: dict) -> str:
    what = f"T = {entry['temperature']:.3f}" if entry["method"] == "temperature" else "Platt per label"
    return f"{what}, fitted on {entry['held_out']} held-out training examples; {entry['measured_on']} split"


def _move_thresholds(task, a: np.ndarray, c: np.ndarray) -> None:
    """A multi-label task's thresholds mapped through the scaling, so that it decides as before:
    p ≥ t ⇔ sigmoid(a·logit(p) + c) ≥ sigmoid(a·logit(t) + c) for a > 0."""
    if not hasattr(task, "thresholds"):
        return
    t = np.clip(np.asarray(task.thresholds(), dtype=np.float64), 1e-12, 1 - 1e-12)
    moved = _sigmoid(a * np.log(t / (1 - t)) + c).tolist()
    if getattr(task, "tuned", None) is not None and task.threshold == "tune":
        task.tuned = moved
    else:
        task.threshold = moved


def write_diagram(path: str, before: list[dict], after: list[dict], title: str) -> str | None:
    """The reliability diagram (accuracy against confidence per bin, before and after, each titled
    with its ECE), written atomically; None (and a log line) where matplotlib is not installed.
    Drawn for a run (here) and for a leaderboard row's pooled seeds (kotune/reporting/plots.py)."""
    from tasks.calibration_metrics import ece_of_bins

    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no reliability diagram (pip install matplotlib)")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    for ax, bins, name in ((axes[0], before, "before"), (axes[1], after, "after")):
        centres = [(r["lo"] + r["hi"]) / 2 for r in bins]
        acc = [r["accuracy"] or 0.0 for r in bins]
        ax.bar(centres, acc, width=1 / len(bins), edgecolor="black", color="#4c72b0", label="accuracy")
        gaps = [(r["confidence"] - r["accuracy"]) if r["count"] else 0.0 for r in bins]
        ax.bar(centres, gaps, bottom=acc, width=1 / len(bins), color="#dd8452", alpha=0.5, label="gap")
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_title(f"{name}: ECE {ece_of_bins(bins):.3f}")
    axes[0].set_ylabel("accuracy")
    axes[0].legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return os.path.basename(path)

