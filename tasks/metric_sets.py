"""What each task family reports, computed from tasks/metrics.py's pure functions. The training
path (``Task.score``) and the ``evaluate`` modules (tasks/evaluate_metrics/) both call these, so a
score is the same number whichever way it is computed."""
from __future__ import annotations

from tasks import metrics


def classification_scores(predictions: list, references: list, labels: list | None = None) -> dict[str, float]:
    """KLUE YNAT / NLI (and any single-label classification): accuracy and macro F1 ×100."""
    return {"accuracy": metrics.accuracy(predictions, references),
            "macro_f1": metrics.macro_f1(predictions, references, labels=labels)}


def sts_scores(predictions: list[float], references: list[float], threshold: float = 3.0) -> dict[str, float]:
    """KLUE STS: Pearson r and F1 after thresholding both sides at ``threshold`` ×100."""
    return {"pearson": metrics.pearson(predictions, references),
            "f1": metrics.binary_f1_at(predictions, references, threshold)}


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
    out = metrics.ner_entity_f1(kept_pred, kept_gold)
    out["char_f1"] = metrics.ner_char_f1(predictions, references, chars=chars)
    out["char_f1_with_o"] = metrics.ner_char_f1(predictions, references, chars=chars, include_o=True)
    return out
