"""Evaluation metrics of spans: KLUE NER's entity and character F1s, KorQuAD 1.0 and KLUE-MRC
answers. Label metrics (classification, regression, multi-label, RE, DP) are in tasks/metrics.py.

Pure functions of plain Python lists / dicts (no torch, no ``evaluate``, no
hub downloads).  Every score is multiplied by 100, as in KLUE-baseline and
KorQuAD's official script.

Reference implementations reproduced here (re-written, same results):

* KLUE-baseline ``klue_baseline/metrics/functional.py`` and
  ``klue_baseline/metrics/utils.py`` (github.com/KLUE-benchmark/KLUE-baseline)
  - NER / MRC.
* KorQuAD 1.0 ``evaluate-v1.0.py`` (korquad.github.io) - KorQuAD EM / F1.
* seqeval 1.2 ``f1_score(..., mode="strict", scheme=IOB2)`` - NER entity F1.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from difflib import SequenceMatcher
from typing import Sequence

from tasks.metrics import _f1_from_counts, _per_class_counts

__all__ = [
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
]

NER_ENTITY_TYPES = ("DT", "LC", "OG", "PS", "QT", "TI")
# The 12 entity tags of KLUE-NER (B-/I- x 6 types); "O" is not included.
NER_ENTITY_TAGS = tuple(f"{p}-{t}" for t in NER_ENTITY_TYPES for p in ("B", "I"))


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
