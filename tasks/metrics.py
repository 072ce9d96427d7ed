"""Evaluation metrics of labels: classification and regression (KLUE YNAT, NLI, STS), multi-label
classification, KLUE RE and KLUE DP. Span metrics (NER entities, KorQuAD and KLUE-MRC answers)
are in tasks/metrics_spans.py.

Pure functions of plain Python lists / dicts (no torch, no ``evaluate``, no
hub downloads).  Every score is multiplied by 100, as in KLUE-baseline and
KorQuAD's official script.

Reference implementations reproduced here (re-written, same results):

* KLUE-baseline ``klue_baseline/metrics/functional.py`` and
  ``klue_baseline/metrics/utils.py`` (github.com/KLUE-benchmark/KLUE-baseline)
  - YNAT / NLI / STS.
* KLUE-baseline ``klue_re_micro_f1`` / ``klue_re_auprc`` and ``klue_dp_{uas,las}_{macro,micro}_f1``
  (same file, commit 443c38b) - RE and DP; sklearn's ``precision_recall_curve`` + ``auc`` (1.9)
  for the AUPRC curve.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Sequence

__all__ = [
    "accuracy",
    "macro_f1",
    "pearson",
    "binary_f1_at",
    "multi_label_scores",
    "klue_re_micro_f1",
    "klue_re_auprc",
    "klue_dp_scores",
    "DP_OTHERS_FROM",
]


def _check_same_length(preds: Sequence, golds: Sequence) -> None:
    if len(preds) != len(golds):
        raise ValueError(f"preds and golds differ in length: {len(preds)} != {len(golds)}")
    if len(golds) == 0:
        raise ValueError("empty input")


def _f1_from_counts(tp: int, fp: int, fn: int, zero_division: float) -> float:
    """F1 = 2PR/(P+R) = 2tp/(2tp+fp+fn); ``zero_division`` when tp+fp+fn == 0.

    With P := zero_division when tp+fp == 0 and R := zero_division when
    tp+fn == 0 (sklearn's convention), F1 is 0 whenever tp == 0 and one of
    fp / fn is non-zero, for either value of zero_division, so the closed
    form below equals sklearn's result in every case.
    """
    denom = 2 * tp + fp + fn
    if denom == 0:
        return float(zero_division)
    return 2.0 * tp / denom


def _per_class_counts(
    preds: Sequence[Hashable], golds: Sequence[Hashable]
) -> tuple[Counter, Counter, Counter]:
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    for p, g in zip(preds, golds):
        if p == g:
            tp[g] += 1
        else:
            fp[p] += 1
            fn[g] += 1
    return tp, fp, fn


# ---------------------------------------------------------------------------
# Classification / regression (YNAT, NLI, STS)
# ---------------------------------------------------------------------------


def accuracy(preds: list, golds: list) -> float:
    """Accuracy x100.  Reproduces KLUE-baseline ``klue_nli_acc``
    (``(preds == targets).mean() * 100``)."""
    _check_same_length(preds, golds)
    return 100.0 * sum(1 for p, g in zip(preds, golds) if p == g) / len(golds)


def macro_f1(preds: list, golds: list, labels: list | None = None) -> float:
    """Macro F1 x100.  Reproduces KLUE-baseline ``ynat_macro_f1``, i.e.
    ``sklearn.metrics.f1_score(golds, preds, average="macro") * 100``.

    Classes are ``labels`` if given, else the union of labels seen in
    ``golds`` and ``preds``.  A class with no gold and no predicted example
    (only possible with explicit ``labels``) scores 0, like sklearn's default
    ``zero_division="warn"``.  Examples whose label is not in ``labels``
    still count as false positives / negatives of the listed classes.
    """
    _check_same_length(preds, golds)
    classes = list(dict.fromkeys(labels)) if labels is not None else list(dict.fromkeys([*golds, *preds]))
    if not classes:
        raise ValueError("no labels")
    tp, fp, fn = _per_class_counts(preds, golds)
    return 100.0 * sum(_f1_from_counts(tp[c], fp[c], fn[c], 0.0) for c in classes) / len(classes)


def pearson(preds: list[float], golds: list[float]) -> float:
    """Pearson r x100.  Reproduces KLUE-baseline ``klue_sts_pearsonr``
    (``scipy.stats.pearsonr(preds, labels)[0] * 100``).  Returns NaN when one
    side is constant (scipy does the same, with a warning)."""
    _check_same_length(preds, golds)
    if len(golds) < 2:
        raise ValueError("pearson needs at least 2 points")
    x = [float(v) for v in preds]
    y = [float(v) for v in golds]
    mx = math.fsum(x) / len(x)
    my = math.fsum(y) / len(y)
    dx = [v - mx for v in x]
    dy = [v - my for v in y]
    sxx = math.fsum(v * v for v in dx)
    syy = math.fsum(v * v for v in dy)
    if sxx == 0.0 or syy == 0.0:
        return float("nan")
    r = math.fsum(a * b for a, b in zip(dx, dy)) / math.sqrt(sxx * syy)
    return 100.0 * max(-1.0, min(1.0, r))  # scipy clips r to [-1, 1]


def binary_f1_at(preds: list[float], golds: list[float], threshold: float = 3.0) -> float:
    """Binary F1 x100 of class 1 after thresholding both sides (``x >= threshold``
    -> 1 else 0).  Reproduces KLUE-baseline ``klue_sts_f1`` (threshold 3,
    ``sklearn f1_score(average="binary")``; 0 when there is no positive at all
    in either side, sklearn's default ``zero_division``)."""
    _check_same_length(preds, golds)
    p = [1 if v >= threshold else 0 for v in preds]
    g = [1 if v >= threshold else 0 for v in golds]
    tp = sum(1 for a, b in zip(p, g) if a == 1 and b == 1)
    fp = sum(1 for a, b in zip(p, g) if a == 1 and b == 0)
    fn = sum(1 for a, b in zip(p, g) if a == 0 and b == 1)
    return 100.0 * _f1_from_counts(tp, fp, fn, 0.0)


# ---------------------------------------------------------------------------
# Multi-label classification (a set of labels per example)
# ---------------------------------------------------------------------------


def multi_label_scores(preds: list, golds: list, labels: list) -> dict[str, float]:
    """Multi-label F1s x100 over ``labels``; each prediction and gold is a collection of label
    names (empty: no label). Reproduces ``sklearn.metrics.f1_score`` on the binarised sets:

    * ``micro_f1``: ``average="micro"`` (true/false positives pooled over every label);
    * ``macro_f1``: ``average="macro"``, a label never gold nor predicted scoring 0 (sklearn's
      default ``zero_division``);
    * ``samples_f1``: ``average="samples", zero_division=1``: an example with no gold and no
      predicted label is a correct empty answer (1), not 0/0;
    * ``subset_accuracy``: the share of examples whose predicted set is the gold set
      (``accuracy_score`` on the indicator rows);
    * ``f1_<label>``: each label's own F1 (``average=None``).

    Names outside ``labels`` count as false positives / negatives of no listed label (ignored)."""
    _check_same_length(preds, golds)
    if not labels:
        raise ValueError("no labels")
    pred_sets, gold_sets = [set(p) for p in preds], [set(g) for g in golds]
    counts = {c: [0, 0, 0] for c in labels}  # tp, fp, fn
    for p, g in zip(pred_sets, gold_sets):
        for c in labels:
            if c in p or c in g:
                counts[c][0 if c in p and c in g else 1 if c in p else 2] += 1
    per_label = {c: _f1_from_counts(*counts[c], 0.0) for c in labels}
    known = set(labels)
    samples = [_f1_from_counts(len(p & g & known), len((p - g) & known), len((g - p) & known), 1.0)
               for p, g in zip(pred_sets, gold_sets)]
    out = {"micro_f1": 100.0 * _f1_from_counts(*(sum(v[k] for v in counts.values()) for k in range(3)), 0.0),
           "macro_f1": 100.0 * sum(per_label.values()) / len(labels),
           "samples_f1": 100.0 * sum(samples) / len(samples),
           "subset_accuracy": 100.0 * sum(p & known == g & known for p, g in zip(pred_sets, gold_sets)) / len(golds)}
    out.update({f"f1_{c}": 100.0 * f for c, f in per_label.items()})
    return out


# ---------------------------------------------------------------------------
# KLUE RE
# ---------------------------------------------------------------------------


def klue_re_micro_f1(preds: list, golds: list, labels: list, no_relation: str = "no_relation") -> float:
    """Micro F1 x100 over every class in ``labels`` except ``no_relation``.  Reproduces
    KLUE-baseline ``klue_re_micro_f1``: ``f1_score(golds, preds, average="micro",
    labels=<all but no_relation>)``; 0 when nothing is predicted or gold in those classes."""
    _check_same_length(preds, golds)
    scored = [c for c in labels if c != no_relation]
    tp, fp, fn = _per_class_counts(preds, golds)
    return 100.0 * _f1_from_counts(sum(tp[c] for c in scored), sum(fp[c] for c in scored),
                                   sum(fn[c] for c in scored), 0.0)


def _pr_auc(targets, scores) -> float:
    """Area under sklearn's ``precision_recall_curve`` (trapezoids over recall, as ``auc``):
    one point per distinct score, then (recall 0, precision 1); with no positive example recall
    is 1 at every threshold, as sklearn sets it."""
    import numpy as np

    order = np.argsort(scores, kind="mergesort")[::-1]
    s, y = scores[order], targets[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(y) - 1]  # the last row of each distinct score
    tps = np.cumsum(y)[last]
    fps = 1 + last - tps
    precision = tps / (tps + fps)
    recall = tps / tps[-1] if tps[-1] > 0 else np.ones_like(tps, dtype=float)
    precision = np.r_[precision[::-1], 1.0]
    recall = np.r_[recall[::-1], 0.0]
    return float(-np.trapezoid(precision, recall))  # recall falls: the area is minus the integral


def klue_re_auprc(probs: list[list[float]], golds: list[int]) -> float:
    """AUPRC x100: the mean over the classes (``no_relation`` included) that have a gold example of
    the one-vs-rest area under the precision-recall curve of the class's predicted probability.
    Follows KLUE-baseline ``klue_re_auprc`` (``np.eye(30)[labels]``, ``precision_recall_curve`` +
    ``auc`` per class, ``np.average``) except for a class with no gold example: its curve is
    undefined (no positives, recall 0/0): KLUE-baseline's scikit-learn 0.24.1 makes the whole
    AUPRC NaN, later versions set recall to 1 and give the class an area of about 0.5, which
    inflates the mean; it is left out here. ``golds`` are class indices into the columns of ``probs``."""
    import numpy as np

    _check_same_length(probs, golds)
    p = np.asarray(probs, dtype=np.float64)
    onehot = np.eye(p.shape[1])[np.asarray(golds, dtype=np.int64)]
    present = [c for c in range(p.shape[1]) if onehot[:, c].any()]
    return 100.0 * float(np.mean([_pr_auc(onehot[:, c], p[:, c]) for c in present]))


# ---------------------------------------------------------------------------
# KLUE DP
# ---------------------------------------------------------------------------

# Relation ids from this index on (KLUE-baseline's get_dep_labels() order: VP_CMP onwards) are
# merged into one "others" class before LAS is scored, as KLUE-baseline does (others_idx = 15).
DP_OTHERS_FROM = 15
_DP_OTHERS, _DP_WRONG_HEAD = -3, -2  # KLUE-baseline's class ids for the merged labels / a wrong head


def klue_dp_scores(pred_heads: list[list[int]], pred_types: list[list[int]],
                   gold_heads: list[list[int]], gold_types: list[list[int]]) -> dict:
    """KLUE-DP UAS and LAS, macro and micro F1 x100, per word over all sentences.  Reproduces
    KLUE-baseline ``klue_dp_{uas,las}_{macro,micro}_f1``:

    * heads are word numbers (0 = root, k = the k-th word); types are relation ids in
      KLUE-baseline's label order; gold -1 marks an unscored word (KLUE-baseline's padding);
    * UAS: sklearn F1 of predicted vs gold heads, the classes being the head *numbers* seen in
      either (macro), or all words (micro = accuracy);
    * LAS: type ids >= ``DP_OTHERS_FROM`` become one class on both sides, then every word with a
      wrong head gets predicted class -2 (a class no gold word has, which counts in the macro
      average with F1 0, as in KLUE-baseline), then sklearn F1 over the union of classes.
    """
    if not (len(pred_heads) == len(pred_types) == len(gold_heads) == len(gold_types)):
        raise ValueError("pred/gold heads and types differ in number of sentences")
    ph, pt, gh, gt = [], [], [], []
    for i, (a, b, c, d) in enumerate(zip(pred_heads, pred_types, gold_heads, gold_types)):
        if not len(a) == len(b) == len(c) == len(d):
            raise ValueError(f"sentence {i}: heads and types differ in length")
        for p_head, p_type, g_head, g_type in zip(a, b, c, d):
            if g_head == -1:  # KLUE-baseline drops these (its head and type paddings coincide)
                continue
            ph.append(p_head)
            gh.append(g_head)
            merged = [_DP_OTHERS if t >= DP_OTHERS_FROM else t for t in (p_type, g_type)]
            pt.append(merged[0] if p_head == g_head else _DP_WRONG_HEAD)
            gt.append(merged[1])
    return {"uas_macro_f1": macro_f1(ph, gh), "uas_micro_f1": accuracy(ph, gh),
            "las_macro_f1": macro_f1(pt, gt), "las_micro_f1": accuracy(pt, gt)}
