"""kotune's metrics as ``evaluate`` modules, one per metric family, shipped inside the package:
``tasks.metrics.load_metric("klue_ner")`` is ``evaluate.load(<this directory>/klue_ner)``, which
needs no network (``HF_HUB_OFFLINE=1`` works). Each module is a thin ``evaluate.Metric`` whose
``_compute`` calls the same pure functions as the training path (tasks/metric_sets.py,
tasks/metrics.py); its description, citation and inputs live in ``FAMILIES`` below.

Adding a family (e.g. KLUE RE or DP, once tasks/metrics.py has its function):

1. write ``<name>_scores(predictions, references, **options) -> dict`` (tasks/metric_sets.py, or
   use a tasks/metrics.py function directly) and let the task's ``score`` call it;
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

from tasks import metrics
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
    return datasets.Features({  # qa: SQuAD's shape, answers as plain strings
        "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
        "references": {"id": datasets.Value("string"), "answers": datasets.Sequence(datasets.Value("string"))}})


def _qa_dicts(predictions: list[dict], references: list[dict]) -> tuple[dict, dict]:
    return ({p["id"]: p["prediction_text"] for p in predictions},
            {r["id"]: list(r["answers"]) for r in references})


def korquad_compute(predictions: list[dict], references: list[dict]) -> dict:
    return metrics.korquad_scores(*_qa_dicts(predictions, references))


def klue_mrc_compute(predictions: list[dict], references: list[dict],
                     question_types: list[int] | None = None) -> dict:
    preds, golds = _qa_dicts(predictions, references)
    types = None if question_types is None else {r["id"]: int(t) for r, t in zip(references, question_types)}
    return metrics.klue_mrc_scores(preds, golds, types)


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
    "korquad": Family(
        korquad_compute, lambda: _features("qa"),
        "KorQuAD 1.0: exact match and character-level F1 x100, as its official evaluate-v1.0.py.",
        KORQUAD_CITATION, QA_INPUTS),
}


def module_dir(name: str) -> str:
    return os.path.join(HERE, name)


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
