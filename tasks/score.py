"""Read any system's predictions for ``action=score`` and line them up with the gold examples.

Accepted files (the format is told by the content, the columns by ``score.*``):

- ``{id: answer}`` JSON: the official prediction file of KorQuAD and KLUE MRC (any task whose
  predictions are single values also works this way);
- kotune's ``predictions.jsonl`` (``{"id", "prediction", ...}`` per line);
- a CSV/TSV/JSON/JSONL table with an id column and a prediction column (``score.id_column``,
  ``score.prediction_column``; by default ``id`` and the first of prediction, label, answer,
  prediction_text). Tag sequences (NER) are a JSON list or whitespace-separated tags.
- KLUE RE: a row's ``probabilities`` ({relation: probability}, as kotune's predictions.jsonl
  writes them) give AUPRC; without them only micro F1 is scored, with a one-line note.
- a prediction spread over several columns (DP: ``heads`` and ``deprels``, as kotune's DP
  ``predictions.jsonl`` writes them, and where present ``truncated_words``: the sentence's last
  words the model never saw, which ``task=dp_klue`` leaves out of the scores) is read as a dict of
  those columns when the file has no single prediction column.

Every gold id needs exactly one prediction: missing or extra ids, and labels outside the task's
label set, are one-line errors that name counts and the first few ids or labels.
"""
from __future__ import annotations

import math
from typing import Any

from tasks.base import LabelWithProbabilities
from kotune.core.errors import DataError
from tasks.io import file_format, read_json, read_records
from kotune.core.log import warn
from tasks.re import RelationTask

PREDICTION_COLUMNS = ("prediction", "label", "answer", "prediction_text")
PROBABILITIES = "probabilities"  # per class, beside a predicted label (kotune's RE predictions.jsonl)
RECORD_COLUMNS = (("heads", "deprels"),)  # predictions made of several columns (DP)
OPTIONAL_COLUMNS = ("truncated_words",)  # read with a record where the file has them (DP)
SHOWN = 5


class LabelsWithProbabilities(list):
    """A predicted label set (multi-label) that also carries the file's label probabilities."""

    def __init__(self, labels: list, probabilities: Any):
        super().__init__(labels)
        self.probabilities = probabilities


def _first(items) -> str:
    items = list(items)
    more = f", … ({len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(repr(x) for x in items[:SHOWN]) + more


def read_predictions(path: str, id_column: str = "id", prediction_column: str | None = None,
                     fmt: str | None = None) -> dict[str, Any]:
    """``{id: prediction}`` from any of the accepted files."""
    fmt = file_format(path, fmt)
    if fmt == "json":
        data = read_json(path)
        if isinstance(data, dict) and not isinstance(data.get("data"), list):
            return {str(k): v for k, v in data.items()}  # the official {id: answer} file
    rows = read_records(path, fmt)
    if not rows:
        raise DataError(path, None, "no predictions in the file")
    where0, row0 = rows[0]
    column = prediction_column or next((c for c in PREDICTION_COLUMNS if c in row0), None)
    record = None if column else next((r for r in RECORD_COLUMNS if all(c in row0 for c in r)), None)
    if record is None and (column is None or column not in row0):
        raise DataError(path, where0, f"no prediction column (looked for "
                                      f"{prediction_column or ', '.join(PREDICTION_COLUMNS)}; the file has "
                                      f"{', '.join(row0)}): set score.prediction_column")
    if id_column not in row0:
        raise DataError(path, where0, f"no id column '{id_column}' (the file has {', '.join(row0)}): "
                                      "set score.id_column")
    out: dict[str, Any] = {}
    for where, row in rows:
        key = str(row.get(id_column))
        if key in out:
            raise DataError(path, where, f"id {key!r} is predicted twice")
        if record:
            out[key] = {c: row.get(c) for c in record + OPTIONAL_COLUMNS if c in record or c in row}
        else:
            value, probabilities = row.get(column), row.get(PROBABILITIES)
            if probabilities is not None and isinstance(value, (str, list)):
                value = (LabelWithProbabilities if isinstance(value, str) else LabelsWithProbabilities)(
                    value, probabilities)
            out[key] = value
    return out


def align(predictions: dict[str, Any], gold_ids: list[str], path: str, gold_path: str) -> list[Any]:
    """The predictions in gold order; any missing or extra id is an error."""
    gold_set = set(gold_ids)
    missing = [i for i in gold_ids if i not in predictions]
    extra = [i for i in predictions if i not in gold_set]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(gold_ids)} gold ids have no prediction (first: {_first(missing)})")
        if extra:
            parts.append(f"{len(extra)} of {len(predictions)} predicted ids are not in {gold_path} "
                         f"(first: {_first(extra)})")
        raise DataError(path, None, "; ".join(parts))
    return [predictions[i] for i in gold_ids]


def check_labels(values: list[str], allowed: list[str], path: str, what: str = "label") -> None:
    unknown = sorted({v for v in values if v not in set(allowed)}, key=str)
    if unknown:
        raise DataError(path, None, f"{len(unknown)} unknown {what}(s): {_first(unknown)} "
                                    f"(the task's {what}s: {_first(allowed) if len(allowed) > 30 else ', '.join(map(repr, allowed))})")


def _tags(value: Any) -> list[str]:
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            import json

            value = json.loads(value)
        else:
            return value.split()
    return [str(t) for t in value]


def to_outputs(task, values: list[Any], examples: list[dict], path: str) -> list[Any]:
    """Raw predicted values → the task's decode() output format, checked against the task."""
    kind = task.head
    if kind in ("span", "span_char"):  # QA: an answer string
        return [{"answer": "" if v is None else str(v)} for v in values]
    if kind.startswith("token"):  # a tag per unit (token, token_char, with or without a CRF)
        outputs = [_tags(v) for v in values]
        for out, ex in zip(outputs, examples):
            if len(out) != len(ex["units"]):
                raise DataError(path, None, f"id {ex['id']!r}: {len(out)} predicted tags for {len(ex['units'])} "
                                            "units (characters for KLUE NER)")
        allowed = list(task.labels or sorted({t for ex in examples for t in ex["tags"]}))
        check_labels([t for out in outputs for t in out], allowed, path, "tag")
        return outputs
    if isinstance(task, RelationTask):
        return _relation_outputs(task, values, examples, path)
    if getattr(task, "multi_label", False):  # a label set per example (tasks/multi_label.py)
        return task.outputs_from(values, [getattr(v, "probabilities", None) for v in values], examples, path)
    if kind == "dependency":  # a head (word number, 0 = root) and a relation per word
        outputs = [_dependency(v, ex, path) for v, ex in zip(values, examples)]
        check_labels([d for out in outputs for d in out["deprels"]], list(task.labels), path, "relation")
        return outputs
    if getattr(task, "regression", False):
        outputs = []
        for v, ex in zip(values, examples):
            try:
                outputs.append(float(v))
            except (TypeError, ValueError):
                raise DataError(path, None, f"id {ex['id']!r}: prediction {v!r} is not a number") from None
            if not math.isfinite(outputs[-1]):
                raise DataError(path, None, f"id {ex['id']!r}: prediction {v!r} is not finite")
        return outputs
    allowed = [str(x) for x in (task.labels or sorted({str(ex["label"]) for ex in examples}))]
    outputs = [str(v) for v in values]
    check_labels(outputs, allowed, path)
    return outputs


def _relation_outputs(task: RelationTask, values: list[Any], examples: list[dict], path: str) -> list[dict]:
    """KLUE RE: the predicted relation, and every relation's probability where the file has them
    (AUPRC needs them all; a file without them scores micro F1 only, and says so)."""
    labels = [str(x) for x in task.labels]
    check_labels([str(v) for v in values], labels, path)
    given = [getattr(v, "probabilities", None) for v in values]
    if any(p is None for p in given):
        warn(f"{path}: no class probabilities ('{PROBABILITIES}': {{relation: probability}} per row, as "
             "kotune's predictions.jsonl has them): scoring micro F1 only, AUPRC needs probabilities")
        return [{"label": str(v), "probs": None} for v in values]
    return [{"label": str(v), "probs": probability_row(probs, labels, path, f"id {ex['id']!r}", "relations")}
            for v, probs, ex in zip(values, given, examples)]


def probability_row(probs: Any, labels: list[str], path: str, where: str, what: str = "labels") -> list[float]:
    """A row's ``{label: probability}`` as a list in ``labels`` order, every label present, finite."""
    if not isinstance(probs, dict) or set(probs) != set(labels):
        raise DataError(path, None, f"{where}: '{PROBABILITIES}' must map each of the {len(labels)} {what} "
                                    "to its probability")
    try:
        row = [float(probs[name]) for name in labels]
    except (TypeError, ValueError):
        raise DataError(path, None, f"{where}: a probability that is not a number") from None
    if not all(math.isfinite(p) for p in row):
        raise DataError(path, None, f"{where}: a probability that is not finite")
    return row
def _dependency(value: Any, ex: dict, path: str) -> dict:
    """``{"heads": [...], "deprels": [...]}`` (or its JSON text) → the DP decode() output, checked."""
    if isinstance(value, str) and value.strip().startswith("{"):
        import json

        value = json.loads(value)
    if not isinstance(value, dict) or not {"heads", "deprels"} <= set(value):
        raise DataError(path, None, f"id {ex['id']!r}: a DP prediction needs heads and deprels (columns "
                                    "'heads' and 'deprels', as kotune's predictions.jsonl), got "
                                    f"{str(value)[:60]!r}")
    heads, deprels = _tags(value["heads"]), _tags(value["deprels"])
    n = len(ex["words"])
    if len(heads) != n or len(deprels) != n:
        raise DataError(path, None, f"id {ex['id']!r}: {len(heads)} heads and {len(deprels)} deprels for {n} words")
    if not all(h.isdigit() and int(h) <= n for h in heads):
        raise DataError(path, None, f"id {ex['id']!r}: heads {heads} are not word numbers 0..{n}")
    truncated = value.get("truncated_words") or 0
    if not (isinstance(truncated, int) and 0 <= truncated <= n):
        raise DataError(path, None, f"id {ex['id']!r}: truncated_words {truncated!r} is not a word count 0..{n}")
    return {"heads": [int(h) for h in heads], "deprels": deprels, "truncated_words": truncated}
