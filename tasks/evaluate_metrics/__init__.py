"""kotune's metrics as ``evaluate`` modules, one per metric family, shipped inside the package:
``load_metric("klue_ner")`` (below) is ``evaluate.load(<this directory>/klue_ner)``, which needs no
network (``HF_HUB_OFFLINE=1`` works). Each module is a thin ``evaluate.Metric`` whose ``_compute``
calls the same functions as the training path (tasks/metric_sets.py); its description, citation
and inputs live in ``FAMILIES`` below.

Adding a family:

1. write ``<name>_scores(predictions, references, **options) -> dict`` in tasks/metric_sets.py
   (from tasks/metrics.py's and tasks/metrics_spans.py's pure functions) and let the task's ``score`` call it;
2. add ``FAMILIES["<name>"] = Family(compute, features, description, citation, inputs)`` here;
3. create ``<name>/<name>.py`` here holding only::

       import evaluate
       from tasks.evaluate_metrics import KotuneMetric

       class Name(KotuneMetric, evaluate.Metric):
           family = "<name>"

4. add ``<name>`` to ``MODULES`` in tests/test_evaluate_metrics.py's agreement test.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from tasks import metric_sets
from tasks.metric_sets import classification_scores, klue_ner_scores, sts_scores

HERE = os.path.dirname(os.path.abspath(__file__))
KLUE_CITATION = """@inproceedings{park2021klue,
  title={KLUE: Korean Language Understanding Evaluation},
  author={Park, Sungjoon and Moon, Jihyung and Kim, Sungdong and others},
  booktitle={NeurIPS Datasets and Benchmarks},
  year={2021}
}"""
KORQUAD_CITATION = """@article{lim2019korquad1,
  title={KorQuAD1.0: Korean QA Dataset for Machine Reading Comprehension},
  author={Lim, Seungyoung and Kim, Myungji and Lee, Jooyoul},
  journal={arXiv preprint arXiv:1909.07005},
  year={2019}
}"""


@dataclass(frozen=True)
class Family:
    compute: Callable[..., dict]
    features: Callable[[], object]  # → datasets.Features (built lazily: datasets is heavy)
    description: str
    citation: str
    inputs: str


def _features(kind: str):
    import datasets

    if kind == "label":
        return datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")})
    if kind == "score":
        return datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")})
    if kind == "tags":
        tags = datasets.Sequence(datasets.Value("string"))
        return datasets.Features({"predictions": tags, "references": tags})
    if kind == "parse":
        tree = {"heads": datasets.Sequence(datasets.Value("int32")), "deprels": datasets.Sequence(datasets.Value("string"))}
        return datasets.Features({"predictions": tree, "references": tree})
    return datasets.Features({  # qa: SQuAD's shape, answers as plain strings
        "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
        "references": {"id": datasets.Value("string"), "answers": datasets.Sequence(datasets.Value("string"))}})


def _qa_dicts(predictions: list[dict], references: list[dict]) -> tuple[dict, dict]:
    return ({p["id"]: p["prediction_text"] for p in predictions},
            {r["id"]: list(r["answers"]) for r in references})


def korquad_compute(predictions: list[dict], references: list[dict]) -> dict:
    return metric_sets.korquad_scores(*_qa_dicts(predictions, references))


def klue_mrc_compute(predictions: list[dict], references: list[dict],
                     question_types: list[int] | None = None) -> dict:
    preds, golds = _qa_dicts(predictions, references)
    types = None if question_types is None else {r["id"]: int(t) for r, t in zip(references, question_types)}
    return metric_sets.klue_mrc_scores(preds, golds, types)


def klue_re_compute(predictions: list[str], references: list[str], probabilities: list[list[float]] | None = None,
                    labels: list[str] | None = None, no_relation: str = "no_relation") -> dict:
    if labels is None:
        if probabilities is not None:
            raise ValueError("klue_re: probabilities need labels= (the relation of each probability column)")
        labels = sorted(set(predictions) | set(references))
    return metric_sets.klue_re_scores(predictions, references, list(labels), probabilities, no_relation)


def klue_dp_compute(predictions: list[dict], references: list[dict],
                    labels: list[str] | None = None) -> dict:
    return metric_sets.klue_dp_scores([p["heads"] for p in predictions], [p["deprels"] for p in predictions],
                                      [r["heads"] for r in references], [r["deprels"] for r in references],
                                      labels or metric_sets.KLUE_DP_LABELS)


QA_INPUTS = """predictions: list of {"id": str, "prediction_text": str};
references: list of {"id": str, "answers": list[str]} (an empty list: unanswerable)."""
FAMILIES: dict[str, Family] = {
    "klue_classification": Family(
        classification_scores, lambda: _features("label"),
        "KLUE YNAT / NLI: accuracy and macro F1 (x100) over the label set, as KLUE-baseline computes them.",
        KLUE_CITATION,
        "predictions, references: label names (str). labels (optional): the label set macro F1 averages "
        "over (default: the labels seen in either list)."),
    "klue_sts": Family(
        sts_scores, lambda: _features("score"),
        "KLUE STS: Pearson r between predicted and gold similarity (0-5), and binary F1 after "
        "thresholding both at 3.0 (x100), as KLUE-baseline.",
        KLUE_CITATION,
        "predictions, references: floats (0-5). threshold (optional, default 3.0)."),
    "klue_ner": Family(
        klue_ner_scores, lambda: _features("tags"),
        "KLUE NER: seqeval strict-IOB2 entity F1 (macro 'entity_f1', micro 'entity_f1_micro'), character "
        "macro F1 over the 12 entity tags ('char_f1') and with O ('char_f1_with_o', KLUE-baseline), x100.",
        KLUE_CITATION,
        "predictions, references: one BIO tag per character (list[list[str]]). chars (optional): the "
        "characters, so whitespace is left out as KLUE-baseline does."),
    "klue_mrc": Family(
        klue_mrc_compute, lambda: _features("qa"),
        "KLUE MRC: exact match and ROUGE-W (LCS-based F1) x100 with KLUE-baseline's normalisation; "
        "an unanswerable question is right only for an empty prediction.",
        KLUE_CITATION,
        QA_INPUTS + "\nquestion_types (optional): KLUE's question_type per reference (1, 2, 3): adds "
                    "per-type scores."),
    "klue_re": Family(
        klue_re_compute, lambda: _features("label"),
        "KLUE RE: micro F1 over the relations other than no_relation and, given every example's "
        "probability of each relation, AUPRC (mean one-vs-rest area under the precision-recall curve), "
        "x100, as KLUE-baseline.",
        KLUE_CITATION,
        "predictions, references: relation names (str). probabilities (optional): per example, the "
        "probability of every relation in labels order (adds auprc). labels: the relation set (needed "
        "with probabilities). no_relation (optional): the class left out of micro F1."),
    "klue_dp": Family(
        klue_dp_compute, lambda: _features("parse"),
        "KLUE DP: UAS and LAS, macro and micro F1 over words x100, as KLUE-baseline (relations from "
        "VP_CMP on in its label order merged into one class for LAS).",
        KLUE_CITATION,
        'predictions, references: per sentence {"heads": list[int] (0 = root, k = the k-th word), '
        '"deprels": list[str]}. labels (optional): the relation order (default KLUE-baseline\'s).'),
    "korquad": Family(
        korquad_compute, lambda: _features("qa"),
        "KorQuAD 1.0: exact match and character-level F1 x100, as its official evaluate-v1.0.py.",
        KORQUAD_CITATION, QA_INPUTS),
}


def module_dir(name: str) -> str:
    return os.path.join(HERE, name)


def load_metric(name: str):
    """The ``evaluate`` module of metric family ``name`` (``FAMILIES``), loaded from the installed
    package: no network."""
    import evaluate

    if name not in FAMILIES or not os.path.isdir(module_dir(name)):
        raise ValueError(f"unknown metric '{name}' (choices: {', '.join(sorted(FAMILIES))})")
    return evaluate.load(module_dir(name))


class KotuneMetric:
    """Mixed into each module's ``evaluate.Metric``: info and compute from ``FAMILIES[family]``."""

    family: str = ""

    def _info(self):
        import evaluate

        spec = FAMILIES[self.family]
        return evaluate.MetricInfo(description=spec.description, citation=spec.citation,
                                   inputs_description=spec.inputs, features=spec.features(),
                                   codebase_urls=["https://github.com/KLUE-benchmark/KLUE-baseline"])

    def _compute(self, predictions, references, **options) -> dict:
        return FAMILIES[self.family].compute(predictions, references, **options)
