"""What each task family reports — the one place every task's named metrics come from — computed
from the pure functions of tasks/metrics.py (labels) and tasks/metrics_spans.py (entities,
answers). The training path (``Task.score``), ``action=score`` and the ``evaluate`` modules
(tasks/evaluate_metrics/) all call these, so a score is the same number whichever way it is computed."""
from __future__ import annotations

from tasks import metrics, metrics_spans


def classification_scores(predictions: list, references: list, labels: list | None = None) -> dict[str, float]:
    """KLUE YNAT / NLI (and any single-label classification): accuracy and macro F1 ×100."""
    return {"accuracy": metrics.accuracy(predictions, references),
            "macro_f1": metrics.macro_f1(predictions, references, labels=labels)}


def multi_label_scores(predictions: list[list[str]], references: list[list[str]], labels: list[str]) -> dict[str, float]:
    """Multi-label classification (a set of labels per example): micro F1 (over every label's
    decisions), macro F1, samples F1, subset accuracy and each label's F1 (``f1_<label>``), ×100."""
    return metrics.multi_label_scores(predictions, references, labels)


def regression_scores(predictions: list[float], references: list[float],
                      threshold: float | None = None) -> dict[str, float]:
    """A regression (``task.regression``): Pearson r, and with a ``threshold`` (``task.threshold``: STS's
    preset sets KLUE's 3.0) F1 ×100 after thresholding both sides there. No threshold, no F1: a cut at
    3.0 means something on STS's 0-5 scale only, and another task's values would score F1 0 at it."""
    out = {"pearson": metrics.pearson(predictions, references)}
    if threshold is not None:
        out["f1"] = metrics.binary_f1_at(predictions, references, float(threshold))
    return out


def sts_scores(predictions: list[float], references: list[float], threshold: float = 3.0) -> dict[str, float]:
    """KLUE STS: Pearson r and F1 after thresholding both sides at ``threshold`` ×100."""
    return regression_scores(predictions, references, threshold)


def klue_ner_scores(predictions: list[list[str]], references: list[list[str]],
                    chars: list[list[str]] | None = None) -> dict[str, float]:
    """KLUE NER on characters, whitespace characters (``chars``) left out: seqeval strict IOB2 entity
    F1 (macro, micro), character macro F1 over the 12 entity tags, and with O (KLUE-baseline)."""
    if chars is None:
        kept_pred, kept_gold = predictions, references
    else:
        keep = [[k for k, c in enumerate(units) if not c.isspace()] for units in chars]
        kept_pred = [[p[k] for k in ks] for p, ks in zip(predictions, keep)]
        kept_gold = [[g[k] for k in ks] for g, ks in zip(references, keep)]
    out = metrics_spans.ner_entity_f1(kept_pred, kept_gold)
    out["char_f1"] = metrics_spans.ner_char_f1(predictions, references, chars=chars)
    out["char_f1_with_o"] = metrics_spans.ner_char_f1(predictions, references, chars=chars, include_o=True)
    return out


def tagging_scores(predictions: list[list[str]], references: list[list[str]], labels: list[str],
                   entities: bool = True) -> dict[str, float]:
    """Any per-unit tagging (``token_cls``): seqeval strict IOB2 entity F1 when the tags have a
    scheme (``entities``), tag accuracy and macro F1 over the tags other than O, ×100."""
    out = metrics_spans.ner_entity_f1(predictions, references) if entities else {}
    flat_pred = [t for seq in predictions for t in seq]
    flat_gold = [t for seq in references for t in seq]
    out["tag_accuracy"] = metrics.accuracy(flat_pred, flat_gold)
    out["tag_macro_f1"] = metrics.macro_f1(flat_pred, flat_gold, labels=[t for t in labels if t != "O"])
    return out


def korquad_scores(predictions: dict[str, str], references: dict[str, list[str]]) -> dict[str, float]:
    """KorQuAD 1.0 (its official evaluate-v1.0.py): exact match and character F1 ×100, ``{id: answer}``
    against ``{id: [gold answers]}``."""
    return metrics_spans.korquad_scores(predictions, references)


def klue_mrc_scores(predictions: dict[str, str], references: dict[str, list[str]],
                    question_types: dict[str, int] | None = None) -> dict[str, float]:
    """KLUE MRC: exact match and ROUGE-W ×100 (an empty gold list: unanswerable), per question type
    when ``question_types`` are given."""
    return metrics_spans.klue_mrc_scores(predictions, references, question_types)


def klue_re_scores(predictions: list[str], references: list[str], labels: list[str],
                   probabilities: list[list[float]] | None = None,
                   no_relation: str = "no_relation") -> dict[str, float]:
    """KLUE RE: micro F1 ×100 over the relations other than ``no_relation``, and AUPRC ×100 from each
    example's probability of every relation in ``labels`` order (left out without probabilities)."""
    out = {"micro_f1": metrics.klue_re_micro_f1(predictions, references, labels, no_relation)}
    if probabilities is not None:
        label_id = {name: k for k, name in enumerate(labels)}
        out["auprc"] = metrics.klue_re_auprc(probabilities, [label_id[g] for g in references])
    return out


# KLUE-baseline's DP relation order (get_dep_labels() in klue_baseline/data/klue_dp.py): LAS merges
# the ids from metrics.DP_OTHERS_FROM on into one class, so the order is part of the metric.
KLUE_DP_LABELS = ("NP", "NP_AJT", "VP", "NP_SBJ", "VP_MOD", "NP_OBJ", "AP", "NP_CNJ", "NP_MOD", "VNP", "DP",
                  "VP_AJT", "VNP_MOD", "NP_CMP", "VP_SBJ", "VP_CMP", "VP_OBJ", "VNP_CMP", "AP_MOD", "X_AJT",
                  "VP_CNJ", "VNP_AJT", "IP", "X", "X_SBJ", "VNP_OBJ", "VNP_SBJ", "X_OBJ", "AP_AJT", "L", "X_MOD",
                  "X_CNJ", "VNP_CNJ", "X_CMP", "AP_CMP", "AP_SBJ", "R", "NP_SVJ")


def klue_dp_scores(pred_heads: list[list[int]], pred_deprels: list[list[str]], gold_heads: list[list[int]],
                   gold_deprels: list[list[str]], labels: list[str] | tuple = KLUE_DP_LABELS) -> dict[str, float]:
    """KLUE DP: UAS and LAS, macro and micro F1 ×100, per word; heads are word numbers (0 = root),
    relations are names, ranked by ``labels`` (KLUE-baseline's order) for the "others" merge."""
    label_id = {name: k for k, name in enumerate(labels)}
    return metrics.klue_dp_scores(pred_heads, [[label_id[d] for d in s] for s in pred_deprels],
                                  gold_heads, [[label_id[d] for d in s] for s in gold_deprels])
