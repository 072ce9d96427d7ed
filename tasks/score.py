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

A row with ``"abstained": true`` (kotune's predictions.jsonl with ``predict.min_confidence``) is
read as :data:`ABSTAINED`: action=score scores the answered rows only and reports the coverage.

Every gold id needs exactly one prediction: missing or extra ids, and labels outside the task's
label set, are one-line errors that name counts and the first few ids or labels.
"""
from __future__ import annotations

from typing import Any

from tasks.base import LabelWithProbabilities
from kotune.core.errors import DataError
from tasks.io import file_format, read_json, read_records
from tasks.outputs import PROBABILITIES, first_few

ABSTAINED = "\x00abstained"  # a row that abstained (its "prediction" is "abstain"): no answer to score
PREDICTION_COLUMNS = ("prediction", "label", "answer", "prediction_text")
RECORD_COLUMNS = (("heads", "deprels"),)  # predictions made of several columns (DP)
OPTIONAL_COLUMNS = ("truncated_words",)  # read with a record where the file has them (DP)


class LabelsWithProbabilities(list):
    """A predicted label set (multi-label) that also carries the file's label probabilities."""

    def __init__(self, labels: list, probabilities: Any):
        super().__init__(labels)
        self.probabilities = probabilities


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
        if row.get("abstained") is True:
            out[key] = ABSTAINED
        elif record:
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
            parts.append(f"{len(missing)} of {len(gold_ids)} gold ids have no prediction (first: {first_few(missing)})")
        if extra:
            parts.append(f"{len(extra)} of {len(predictions)} predicted ids are not in {gold_path} "
                         f"(first: {first_few(extra)})")
        raise DataError(path, None, "; ".join(parts))
    return [predictions[i] for i in gold_ids]
