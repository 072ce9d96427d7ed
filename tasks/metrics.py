"""Evaluation metrics for KLUE tasks and KorQuAD 1.0.

Pure functions of plain Python lists / dicts (no torch, no ``evaluate``, no
hub downloads).  Every score is multiplied by 100, as in KLUE-baseline and
KorQuAD's official script.

Reference implementations reproduced here (re-written, same results):

* KLUE-baseline ``klue_baseline/metrics/functional.py`` and
  ``klue_baseline/metrics/utils.py`` (github.com/KLUE-benchmark/KLUE-baseline)
  - YNAT / NLI / STS / NER / MRC.
* KorQuAD 1.0 ``evaluate-v1.0.py`` (korquad.github.io) - KorQuAD EM / F1.
* seqeval 1.2 ``f1_score(..., mode="strict", scheme=IOB2)`` - NER entity F1.
* KLUE-baseline ``klue_re_micro_f1`` / ``klue_re_auprc`` and ``klue_dp_{uas,las}_{macro,micro}_f1``
  (same file, commit 443c38b) - RE and DP; sklearn's ``precision_recall_curve`` + ``auc`` (1.9)
  for the AUPRC curve.
"""

from __future__ import annotations

import math
import re
import string
import warnings
from collections import Counter
from difflib import SequenceMatcher
from typing import Hashable, Sequence

__all__ = [
    "accuracy",
    "macro_f1",
    "pearson",
    "binary_f1_at",
    "multi_label_scores",
    "ner_entity_f1",
    "ner_char_f1",
    "NER_ENTITY_TAGS",
    "korquad_normalize",
    "korquad_em",
    "korquad_f1",
    "korquad_scores",
    "klue_mrc_normalize",
    "klue_mrc_rouge_w",
    "klue_mrc_scores",
    "klue_re_micro_f1",
    "klue_re_auprc",
    "klue_dp_scores",
    "DP_OTHERS_FROM",
]

NER_ENTITY_TYPES = ("DT", "LC", "OG", "PS", "QT", "TI")
# The 12 entity tags of KLUE-NER (B-/I- x 6 types); "O" is not included.
NER_ENTITY_TAGS = tuple(f"{p}-{t}" for t in NER_ENTITY_TYPES for p in ("B", "I"))


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
# NER
# ---------------------------------------------------------------------------


def strict_iob2_entities(seq: Sequence[str], sent_id: int) -> set[tuple[int, str, int, int]]:
    """Entities as seqeval's ``Tokens(seq, IOB2).entities`` (strict mode).

    A chunk starts only at ``B-X`` and extends over the following ``I-X`` of
    the same type; an ``I-`` that does not continue such a chunk (e.g. one
    following ``O``) belongs to no entity.  The type is ``tag[1:].strip("-")``
    (``"_"`` if empty), as in seqeval.
    """
    prefixes: list[str] = []
    types: list[str] = []
    for tag in seq:
        if not tag or tag[0] not in "BIO":
            raise ValueError(f"invalid IOB2 tag: {tag!r}")
        prefixes.append(tag[0])
        types.append(tag[1:].strip("-") or "_")
    entities = set()
    i, n = 0, len(seq)
    while i < n:
        if prefixes[i] == "B":
            j = i + 1
            while j < n and prefixes[j] == "I" and types[j] == types[i]:
                j += 1
            entities.add((sent_id, types[i], i, j))
            i = j
        else:
            i += 1
    return entities


def ner_entity_f1(pred_tags: list[list[str]], gold_tags: list[list[str]]) -> dict:
    """Entity-level F1 x100 as ``seqeval.metrics.f1_score(gold, pred,
    mode="strict", scheme=IOB2)``: ``{"entity_f1": macro, "entity_f1_micro": micro}``.

    Macro averages per-type F1 over the union of entity types found in gold
    or predictions (a type never predicted / never in gold scores 0); it is
    NaN when there is no entity at all, exactly like seqeval.

    KLUE-baseline's ``klue_ner_entity_macro_f1`` calls
    ``ner_f1_score([labels], [preds], average="macro", mode="strict",
    scheme=IOB2) * 100`` on ONE sequence: all sentences are concatenated at
    character level, each wrapped in the [CLS]/[SEP] positions (gold "O",
    predicted = the model's argmax there), whitespace characters dropped and
    sentences truncated to what fits in max_seq_length.  Evaluating sentence
    by sentence, as here, gives the same result whenever the model predicts
    "O" at [CLS]/[SEP] (then the separators split the chunks identically).
    """
    if len(pred_tags) != len(gold_tags):
        raise ValueError("pred_tags and gold_tags differ in number of sentences")
    true_ents: set = set()
    pred_ents: set = set()
    for k, (p, g) in enumerate(zip(pred_tags, gold_tags)):
        if len(p) != len(g):
            raise ValueError(f"sentence {k}: {len(p)} predicted tags vs {len(g)} gold tags")
        true_ents |= strict_iob2_entities(g, k)
        pred_ents |= strict_iob2_entities(p, k)

    def prf(tp: int, n_pred: int, n_true: int) -> float:
        # seqeval: precision/recall := 0 on zero division, F := 0 if P+R == 0
        prec = tp / n_pred if n_pred else 0.0
        rec = tp / n_true if n_true else 0.0
        return 2 * prec * rec / (prec + rec) if prec + rec else 0.0

    types = sorted({e[1] for e in true_ents} | {e[1] for e in pred_ents})
    per_type = []
    for t in types:
        te = {e for e in true_ents if e[1] == t}
        pe = {e for e in pred_ents if e[1] == t}
        per_type.append(prf(len(te & pe), len(pe), len(te)))
    macro = sum(per_type) / len(per_type) if per_type else float("nan")
    micro = prf(len(true_ents & pred_ents), len(pred_ents), len(true_ents))
    return {"entity_f1": 100.0 * macro, "entity_f1_micro": 100.0 * micro}


def ner_char_f1(
    pred_tags: list[list[str]],
    gold_tags: list[list[str]],
    chars: list[list[str]] | None = None,
    include_o: bool = False,
) -> float:
    """Character-level macro F1 x100 over per-character tags of all sentences.

    Characters that are whitespace (``chars[i][j].isspace()``, when ``chars``
    is given) are left out, as KLUE-baseline drops the " " rows of the NER
    TSV before scoring.

    * ``include_o=False``: macro over the 12 entity tags ``NER_ENTITY_TAGS``
      (KLUE paper's definition).
    * ``include_o=True``: KLUE-baseline's ``klue_ner_char_macro_f1``, which
      despite its docstring "(except O tag)" calls
      ``sklearn.metrics.f1_score(trues, preds, labels=list(range(len(label_list))),
      average="macro", zero_division=True)``, i.e. macro over all 13 labels
      including "O".

    In both cases a tag with no gold and no predicted character scores 1
    (``zero_division=True``, KLUE-baseline's setting; kept for the 12-tag
    variant so that the two differ only by "O").  Not reproduced here: the
    baseline also scores each sentence's [CLS]/[SEP] positions (gold "O") and
    truncates sentences to max_seq_length; pass such positions in explicitly
    to emulate that.
    """
    if len(pred_tags) != len(gold_tags) or (chars is not None and len(chars) != len(gold_tags)):
        raise ValueError("inputs differ in number of sentences")
    flat_p: list[str] = []
    flat_g: list[str] = []
    for k in range(len(gold_tags)):
        p, g = pred_tags[k], gold_tags[k]
        c = chars[k] if chars is not None else None
        if len(p) != len(g) or (c is not None and len(c) != len(g)):
            raise ValueError(f"sentence {k}: lengths differ")
        for j in range(len(g)):
            if c is not None and c[j].isspace():
                continue
            flat_p.append(p[j])
            flat_g.append(g[j])
    labels = list(NER_ENTITY_TAGS) + (["O"] if include_o else [])
    tp, fp, fn = _per_class_counts(flat_p, flat_g)
    return 100.0 * sum(_f1_from_counts(tp[t], fp[t], fn[t], 1.0) for t in labels) / len(labels)


# ---------------------------------------------------------------------------
# KorQuAD 1.0 (evaluate-v1.0.py)
# ---------------------------------------------------------------------------

# evaluate-v1.0.py's remove_(): each of these characters becomes a space.
_KORQUAD_TO_SPACE = str.maketrans({ch: " " for ch in "'\"《》<>〈〉()‘’"})
_PUNCTUATION = frozenset(string.punctuation)


def korquad_normalize(s: str) -> str:
    """KorQuAD 1.0 ``normalize_answer``: quote/bracket characters
    ' " 《 》 < > 〈 〉 ( ) ‘ ’ -> space, lowercase, drop ASCII
    ``string.punctuation``, collapse whitespace (same order as the script)."""
    s = s.translate(_KORQUAD_TO_SPACE).lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    return " ".join(s.split())


def korquad_em(pred: str, gold: str) -> float:
    """KorQuAD 1.0 ``exact_match_score``: 1.0 iff normalized strings are equal."""
    return float(korquad_normalize(pred) == korquad_normalize(gold))


def korquad_f1(pred: str, gold: str) -> float:
    """KorQuAD 1.0 ``f1_score``: F1 over the multiset of characters of the
    normalized strings with whitespace removed; 0 when nothing is shared
    (so two empty strings give F1 0 but EM 1, as in the script)."""
    p_chars = list("".join(korquad_normalize(pred).split()))
    g_chars = list("".join(korquad_normalize(gold).split()))
    same = sum((Counter(p_chars) & Counter(g_chars)).values())
    if same == 0:
        return 0.0
    precision = same / len(p_chars)
    recall = same / len(g_chars)
    return 2 * precision * recall / (precision + recall)


def korquad_scores(predictions: dict[str, str], golds: dict[str, list[str]]) -> dict:
    """KorQuAD 1.0 ``evaluate()``: ``{"exact_match", "f1"}`` x100, each the
    mean over ``golds`` of the max over its gold answers.  A question without
    a prediction scores 0 but stays in the denominator (the script prints
    "Unanswered question ... will receive score 0."; here one warning)."""
    if not golds:
        raise ValueError("no gold questions")
    em_total = f1_total = 0.0
    missing = 0
    for qid, answers in golds.items():
        if qid not in predictions:
            missing += 1
            continue
        if not answers:
            raise ValueError(f"question {qid!r} has no gold answer")
        pred = predictions[qid]
        em_total += max(korquad_em(pred, a) for a in answers)
        f1_total += max(korquad_f1(pred, a) for a in answers)
    if missing:
        warnings.warn(f"{missing} unanswered question(s) will receive score 0.", stacklevel=2)
    return {"exact_match": 100.0 * em_total / len(golds), "f1": 100.0 * f1_total / len(golds)}


# ---------------------------------------------------------------------------
# KLUE-MRC (KLUE-baseline klue_mrc_em / klue_mrc_rouge_w)
# ---------------------------------------------------------------------------

# KLUE-baseline metrics/utils.py, verbatim:
#     NORMALIZE_CHAR_PATTERN = re.compile(r"[\'\"《》<>〈〉]\(\)\‘\’")
# The character class closes after 〉, so the pattern only matches ONE of
# ' " 《 》 < > 〈 〉 immediately followed by the literal text "()‘’" - in
# practice never.  Consequences, reproduced on purpose: 《 》 〈 〉 ‘ ’ (not
# ASCII punctuation) survive normalisation, while ' " < > ( ) are deleted by
# the string.punctuation step without leaving a space ("서울(한국)" ->
# "서울한국", whereas KorQuAD gives "서울 한국").
_KLUE_MRC_CHAR_PATTERN = re.compile(r"[\'\"《》<>〈〉]\(\)\‘\’")


def klue_mrc_normalize(answer: str) -> str:
    """KLUE-baseline ``normalize_answer_for_klue_mrc``: lowercase, apply the
    (quirky) quote/bracket regex, drop ``string.punctuation``, collapse spaces."""
    answer = _KLUE_MRC_CHAR_PATTERN.sub(" ", answer.lower())
    answer = "".join(ch for ch in answer if ch not in _PUNCTUATION)
    return " ".join(answer.split())


def klue_mrc_rouge_w(pred: str, gold: str) -> float:
    """KLUE-baseline ``rouge_w_score_for_klue_mrc`` (beta=1) on already
    normalized strings, in [0, 1]: F1 of the longest common *contiguous*
    substring (despite the name, not the weighted-LCS ROUGE-W).

    An empty gold (unanswerable) scores 1 iff the prediction is empty too.
    The substring comes from ``difflib.SequenceMatcher(None, pred, gold)
    .find_longest_match`` exactly as in the baseline, including difflib's
    default ``autojunk`` heuristic (only active for golds of >= 200 chars).
    """
    if gold == "":
        return float(pred == gold)
    lccs = SequenceMatcher(None, pred, gold).find_longest_match(0, len(pred), 0, len(gold)).size
    precision = lccs / len(pred) if len(pred) else 0.0
    recall = lccs / len(gold)
    if precision + recall == 0.0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def klue_mrc_scores(
    predictions: dict[str, str],
    golds: dict[str, list[str]],
    question_types: dict[str, int] | None = None,
) -> dict:
    """KLUE-MRC EM and "ROUGE-W" x100 as KLUE-baseline ``klue_mrc_em`` /
    ``klue_mrc_rouge_w``.

    Prediction and gold answers go through ``klue_mrc_normalize``; an
    unanswerable question (empty gold list) has the single gold ``""``, so
    only a prediction that normalizes to ``""`` scores EM = ROUGE-W = 1.  Per
    question the max over gold answers is taken; totals are means over all
    questions of ``golds``.  With ``question_types``, also
    ``exact_match_type{t}`` / ``rouge_w_type{t}`` for every type present
    (KLUE: 1 paraphrase, 2 multi-sentence reasoning, 3 unanswerable).

    A gold question without prediction raises ``KeyError``, as
    ``klue_mrc_em`` does (``preds[example.qas_id]``); KLUE-baseline's offline
    ``evaluate_for_klue_mrc`` silently skips such questions instead.
    """
    if not golds:
        raise ValueError("no gold questions")
    missing = [qid for qid in golds if qid not in predictions]
    if missing:
        raise KeyError(f"{len(missing)} question(s) without prediction, e.g. {missing[0]!r}")
    em: dict[str, float] = {}
    rw: dict[str, float] = {}
    for qid, answers in golds.items():
        pred = klue_mrc_normalize(predictions[qid])
        gts = [klue_mrc_normalize(a) for a in answers] or [""]
        em[qid] = max([0.0] + [float(pred == g) for g in gts])
        rw[qid] = max([0.0] + [klue_mrc_rouge_w(pred, g) for g in gts])
    out = {
        "exact_match": 100.0 * sum(em.values()) / len(em),
        "rouge_w": 100.0 * sum(rw.values()) / len(rw),
    }
    if question_types is not None:
        by_type: dict[int, list[str]] = {}
        for qid in golds:
            by_type.setdefault(question_types[qid], []).append(qid)
        for t in sorted(by_type):
            ids = by_type[t]
            out[f"exact_match_type{t}"] = 100.0 * sum(em[q] for q in ids) / len(ids)
            out[f"rouge_w_type{t}"] = 100.0 * sum(rw[q] for q in ids) / len(ids)
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
