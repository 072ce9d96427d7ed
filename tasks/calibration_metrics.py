"""How far a model's probabilities are from the frequencies they claim (``train.calibrate``,
kotune/calibration/fit.py): expected and maximum calibration error over equal-width confidence bins
(Guo et al., 2017), the Brier score and the negative log-likelihood. Pure functions of plain lists:
``probs`` a row of class probabilities per item, ``labels`` the gold class index of each item (a
multi-label task's items are its (row, label) pairs, each a two-class row ``[1 - p, p]``)."""
from __future__ import annotations

import math

import numpy as np

BINS = 15  # equal-width confidence bins, as Guo et al. (2017)
EPS = 1e-12  # log(0) guarded: a probability of exactly 0 on the gold class costs -log(1e-12)


def softmax(logits: list[list[float]], temperature: float = 1.0) -> list[list[float]]:
    """Each row's softmax of ``logits / temperature``."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = np.exp(z - z.max(-1, keepdims=True))
    return (z / z.sum(-1, keepdims=True)).tolist()


def binary_rows(probs: list[float]) -> list[list[float]]:
    """One sigmoid probability per item as a two-class row ``[1 - p, p]``."""
    return [[1.0 - float(p), float(p)] for p in probs]


def reliability_bins(probs: list[list[float]], labels: list[int], bins: int = BINS) -> list[dict]:
    """Items grouped by their confidence (the top probability) into ``bins`` equal-width bins
    ``(lo, hi]`` (a confidence of 0 falls in the first): each bin's range, item count, mean
    confidence and accuracy (None for an empty bin)."""
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    conf, correct = p.max(-1), (p.argmax(-1) == y).astype(np.float64)
    index = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)
    out = []
    for b in range(bins):
        members = index == b
        n = int(members.sum())
        out.append({"lo": b / bins, "hi": (b + 1) / bins, "count": n,
                    "confidence": float(conf[members].mean()) if n else None,
                    "accuracy": float(correct[members].mean()) if n else None})
    return out


def pooled_bins(runs: list[list[dict]]) -> list[dict]:
    """Several runs' reliability bins (the same edges) as one set: per bin the summed count and
    the count-weighted mean confidence and accuracy, as if the runs' items had been binned together."""
    out = []
    for same_bin in zip(*runs):
        n = sum(r["count"] for r in same_bin)
        mean = (lambda key: sum(r["count"] * r[key] for r in same_bin if r["count"]) / n) if n else (lambda key: None)
        out.append({"lo": same_bin[0]["lo"], "hi": same_bin[0]["hi"], "count": n,
                    "confidence": mean("confidence"), "accuracy": mean("accuracy")})
    return out


def ece_of_bins(rows: list[dict]) -> float:
    """Expected calibration error of reliability bins: the count-weighted mean of |accuracy − confidence|."""
    total = sum(r["count"] for r in rows)
    return sum(r["count"] / total * abs(r["accuracy"] - r["confidence"]) for r in rows if r["count"])


def ece(probs: list[list[float]], labels: list[int], bins: int = BINS) -> float:
    """Expected calibration error: the count-weighted mean of |accuracy − confidence| over the bins."""
    return ece_of_bins(reliability_bins(probs, labels, bins))


def mce(probs: list[list[float]], labels: list[int], bins: int = BINS) -> float:
    """Maximum calibration error: the largest |accuracy − confidence| of a non-empty bin."""
    return max(abs(r["accuracy"] - r["confidence"]) for r in reliability_bins(probs, labels, bins) if r["count"])


def brier(probs: list[list[float]], labels: list[int]) -> float:
    """The mean over items of the squared distance between the probability row and the one-hot gold."""
    p = np.asarray(probs, dtype=np.float64)
    gold = np.zeros_like(p)
    gold[np.arange(len(p)), np.asarray(labels, dtype=np.int64)] = 1.0
    return float(((p - gold) ** 2).sum(-1).mean())


def nll(probs: list[list[float]], labels: list[int]) -> float:
    """The mean negative log-probability of the gold class."""
    return float(np.mean([-math.log(max(float(row[y]), EPS)) for row, y in zip(probs, labels)]))


def calibration_scores(probs: list[list[float]], labels: list[int], bins: int = BINS) -> dict[str, float]:
    """ECE, MCE (``bins`` equal-width bins), Brier score, NLL and accuracy of one set of items."""
    if not len(probs):
        raise ValueError("calibration scores of no items")
    p = np.asarray(probs, dtype=np.float64)
    accuracy = float((p.argmax(-1) == np.asarray(labels)).mean())
    return {"ece": ece(probs, labels, bins), "mce": mce(probs, labels, bins), "brier": brier(probs, labels),
            "nll": nll(probs, labels), "accuracy": accuracy}
