"""Sequence-level tasks: YNAT (single text), NLI (pair), STS (pair regression), and the generic
``text_cls`` / ``text_pair`` tasks for custom CSV/TSV/JSON/JSONL files.

Columns come from an explicit map (``task.columns``: id, text, text_pair, label: the task's defaults,
which ``data.<role>_column`` replaces; ``Task.use_columns``), never guessed: a file without the
default text column(s) is read by a conventional name only when exactly one fits
(``tasks.io.KNOWN_TEXT_COLUMNS``: ``sentence``, ``document``; pairs ``sentence1/sentence2``,
``premise/hypothesis``). Labels are mapped by *name*: hub and KLUE-baseline label orders differ.
Predictions carry the input text and each label's probability.
"""
from __future__ import annotations

import json
import math
import os
import uuid
from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks.metric_sets import classification_scores, regression_scores
from tasks.base import EncodeSettings, LabelWithProbabilities, Task, TaskOption
from kotune.core.errors import ConfigError, DataError
from kotune.core.files import write_json_atomic
from tasks.io import KNOWN_PAIR_COLUMNS, KNOWN_TEXT_COLUMNS, column_names, conventional_columns, field, read_records, require_columns
from tasks.windows import encode_windows, window_options

PROBABILITY_DIGITS = 4  # predictions.jsonl: each label's probability, rounded for reading
# beside predictions.jsonl: each row's probabilities at full precision, for action=label_issues (rounded ones tie
# rows that are not tied, and cleanlab's flags then depend on the rows' order)
EXACT_PROBABILITIES = "probabilities.json"


@register_task("ynat", "nli", "sts", "text_cls", "text_pair")
class ClassificationTask(Task):
    """[CLS] classification (``num_labels`` > 1) or regression (``task.regression: true``)."""

    # a regression head is not a classifier, nor a sigmoid per label (task=multi_label) a softmax; a
    # model trained on windowed documents reads them so
    saved_options = {"regression": "error", "multi_label": "error", "long_text": "saved", "window_stride": "saved",
                     "window_pool": "saved"}
    own_options = {"long_text": TaskOption((None, "truncate"), "documents become windows in sequence classification"),
                   **{option: TaskOption((None,), "an option of task.long_text=windows")
                      for option in ("window_stride", "window_pool", "max_windows_per_batch")}}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.regression = bool(cfg.get("regression", False))
        self.pair = bool(cfg.columns.get("text_pair"))  # two texts, encoded as one sequence: [CLS] a [SEP] b [SEP]
        self.windows = window_options(cfg)  # task.long_text=windows (tasks/windows.py), else None

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        records = read_records(path, self.cfg.get("format") or self.reading.format, self.reading.quoting)
        origins = self.columns_for_file(path, column_names(records),
                                        ("text", "text_pair", "group") + (("label",) if labelled else ()))
        cols = self.cfg.columns
        self._conventional_columns(path, records)
        needed = {"text": cols.text, "text_pair": cols.get("text_pair"), "group": cols.get("group")}
        if labelled:  # a predict file may come without labels
            needed.update(self.label_columns())
        require_columns(path, records, needed, self.column_options, origins)
        examples = []
        for where, row in records:
            # no id column: file name and row, as token tasks do (the same rows have the same ids
            # wherever the file lies, so predictions line up with a copy without labels)
            ex = {"id": str(row.get(cols.get("id") or "guid", f"{os.path.basename(path)}:{where}")), "row": where}
            ex["text"] = self._text(path, where, field(path, where, row, cols.text), self._column("text"))
            if cols.get("text_pair"):
                ex["text_pair"] = self._text(path, where, field(path, where, row, cols.text_pair),
                                             self._column("text_pair"))
            if cols.get("group"):  # data.group_column: rows that stay on one side of any split
                ex["group"] = str(field(path, where, row, cols.group))
            self.read_label(path, where, row, ex, labelled)
            examples.append(ex)
        return examples

    def label_columns(self) -> dict[str, str]:
        """Role → the column a labelled file must have."""
        column = self.cfg.columns.label
        if not isinstance(column, str):
            raise ConfigError(f"data.label_column={list(column)} names several columns: one label per text "
                              f"comes from one column (a label set from several: task=multi_label)")
        return {"label": column}

    def read_label(self, path: str, where: str, row: dict, ex: dict, labelled: bool) -> None:
        """``ex["label"]`` from the row (absent in an unlabelled predict file)."""
        column = self.label_columns()["label"]
        raw = field(path, where, row, column, required=labelled)
        if raw is not None and raw != "":
            ex["label"] = self._label(path, where, raw)
        elif labelled:
            raise DataError(path, where, f"empty label (column '{column}')")

    def _conventional_columns(self, path: str, records: list) -> None:
        """Text roles with neither a data.<role>_column nor their default column in the file:
        the conventional names (tasks/io.py), recorded in ``task.columns`` (saved with the model)."""
        roles = ("text", "text_pair") if self.pair else ("text",)
        if not records or self.explicit_columns & set(roles):
            return
        known = KNOWN_PAIR_COLUMNS if self.pair else tuple((name,) for name in KNOWN_TEXT_COLUMNS)
        found = conventional_columns(path, column_names(records), tuple(self.cfg.columns[r] for r in roles), known,
                                     tuple(self.column_options[r] for r in roles))
        for role, name in zip(roles, found):
            self.cfg.columns[role] = name

    def read_hub(self, rows, path: str) -> list[dict]:
        cols = self.cfg.hub.columns
        names = None
        if not self.regression:  # hub labels are class ids: translate through the hub's own names
            names = rows.features[cols.label].names
        examples = []
        for i, row in enumerate(rows):
            where = f"row {i}"
            ex = {"id": str(row.get("guid", i)), "row": where,
                  "text": self._text(path, where, field(path, where, row, cols.text), f"column '{cols.text}'")}
            if cols.get("text_pair"):
                ex["text_pair"] = self._text(path, where, field(path, where, row, cols.text_pair),
                                             f"column '{cols.text_pair}'")
            raw = field(path, where, row, cols.label)
            ex["label"] = self._label(path, where, names[raw] if names else raw)
            examples.append(ex)
        return examples

    @property
    def request_fields(self) -> tuple[str, ...]:
        return ("text", "text_pair") if self.pair else ("text",)

    def request_examples(self, items: list[dict[str, str]], source: str = "request") -> list[dict]:
        return [{"id": f"item {i}", **{k: self._text(source, f"item {i}", item.get(k), f"field '{k}'")
                                       for k in self.request_fields}}
                for i, item in enumerate(items)]

    def holdout_group(self, example: dict) -> str | None:
        """Pairs that share their first text (an NLI premise, an STS sentence) split together."""
        return example["text"] if "text_pair" in example else None

    def _column(self, role: str) -> str:
        """A text role's column as messages name it: ``column 'review' (data.text_column)``."""
        return f"column '{self.cfg.columns[role]}' ({self.column_options.get(role, 'task.columns.' + role)})"

    @staticmethod
    def _text(path: str, where: str, value: Any, column: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise DataError(path, where, f"empty or non-text value {value!r} in {column}")
        return value

    def _label(self, path: str, where: str, raw: Any):
        if self.regression:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise DataError(path, where, f"label {raw!r} is not a number") from None
            if not math.isfinite(value):
                raise DataError(path, where, f"label {raw!r} is not finite")
            return value
        name = str(raw)
        if self.labels is not None and name not in self.labels:
            raise DataError(path, where, f"unknown label '{name}' (expected one of: "
                                         f"{', '.join(self.labels)})")
        return name

    def outputs_from_predictions(self, values: list[Any], examples: list[dict], path: str) -> list[Any]:
        if not self.regression:
            return super().outputs_from_predictions(values, examples, path)
        outputs = []
        for v, ex in zip(values, examples):
            try:
                outputs.append(float(v))
            except (TypeError, ValueError):
                raise DataError(path, None, f"id {ex['id']!r}: prediction {v!r} is not a number") from None
            if not math.isfinite(outputs[-1]):
                raise DataError(path, None, f"id {ex['id']!r}: prediction {v!r} is not finite")
        return outputs

    def fit_labels(self, train: list[dict]) -> None:
        if self.labels is None and not self.regression:
            self.labels = sorted({ex["label"] for ex in train if "label" in ex})

    @property
    def labels_pinnable(self) -> bool:  # a regression's label is a number: no set to pin
        return not self.regression

    def label_rows(self, examples: list[dict]) -> list[tuple[Any, list[str]]]:
        if self.regression:
            return []
        return [(ex.get("row", f"id {ex['id']!r}"), ex["label"] if isinstance(ex["label"], list) else [ex["label"]])
                for ex in examples if "label" in ex]

    def check_labels(self, examples: list[dict], path: str) -> None:
        """For label sets learned from training data: validation labels must be among them."""
        for ex in examples:
            if "label" in ex and not self.regression and ex["label"] not in self.labels:
                # the row where the file has one (an id is the file's name and row, or its own id column)
                raise DataError(path, ex.get("row", f"id {ex['id']!r}"), f"unknown label '{ex['label']}' (training labels: "
                                                f"{', '.join(self.labels)})")

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        for ex in examples:
            yield ex["text"]
            if "text_pair" in ex:
                yield ex["text_pair"]

    def head_kwargs(self) -> dict:
        return {"num_labels": 1 if self.regression else len(self.labels)}

    # ---- encoding ------------------------------------------------------------------------
    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        columns = {"text": [ex["text"] for ex in examples]}
        if self.pair:
            columns["text_pair"] = [ex["text_pair"] for ex in examples]
        if all("label" in ex for ex in examples):
            columns["labels"] = self.label_values(examples)
        if self.windows is not None:  # a row per document, its input a list of windows
            labels = {"labels": columns["labels"]} if "labels" in columns else {}
            return datasets.Dataset.from_dict({**encode_windows(tokenizer, examples, self.pair,
                                                                settings.max_length, self.windows,
                                                                settings.token_type_ids), **labels})
        raw = datasets.Dataset.from_dict(columns)

        def tokenize(batch):
            enc = tokenizer(batch["text"], batch.get("text_pair"), truncation=True,
                            max_length=settings.max_length,
                            return_token_type_ids=settings.token_type_ids)
            return dict(enc)

        # a fresh fingerprint, as datasets gives a function it cannot hash: hashing this one pickles the
        # whole tokenizer on every call (~60 ms, most of a served request's time); in memory, unused
        return raw.map(tokenize, batched=True, remove_columns=[c for c in ("text", "text_pair")
                                                                if c in columns],
                       desc=f"tokenizing {self.name}", new_fingerprint=uuid.uuid4().hex)

    def label_values(self, examples: list[dict]) -> list:
        """The ``labels`` column: a class id per example (a float for regression)."""
        if self.regression:
            return [float(ex["label"]) for ex in examples]
        label_id = {name: i for i, name in enumerate(self.labels or [])}
        return [label_id[ex["label"]] for ex in examples]

    def encode_key(self) -> dict:
        return {k: v for k, v in super().encode_key().items() if k != "max_windows_per_batch"}  # memory only

    @classmethod
    def export_note(cls, options: dict) -> str | None:
        if options.get("long_text") != "windows":
            return None
        return (f"trained on documents cut into windows of max_length tokens sharing {options.get('window_stride')}, "
                f"a document's logits the {options.get('window_pool')} of its windows': a pipeline truncates a longer "
                "text instead; docs/long-documents.md has the recipe (config.kotune_windows)")

    @classmethod
    def export_fields(cls, options: dict) -> dict:
        fields = {}
        if options.get("regression"):  # sentence-transformers' CrossEncoder: the value itself, not its sigmoid
            fields["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
        if options.get("long_text") == "windows":
            fields["kotune_windows"] = {"stride": options.get("window_stride"), "pool": options.get("window_pool")}
        return fields

    # ---- decoding and scoring ------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[Any]:
        logits = np.asarray(predictions, dtype=np.float64)
        if self.regression:
            return [float(v) for v in logits.reshape(len(logits), -1)[:, 0]]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        outputs = []
        for i, row in zip(logits.argmax(-1), probs):
            exact = dict(zip(self.labels, map(float, row)))
            rounded = {label: round(p, PROBABILITY_DIGITS) for label, p in exact.items()}
            outputs.append(LabelWithProbabilities(self.labels[i], rounded, exact))
        return outputs

    def abstention_refusal(self) -> str | None:
        if self.regression:
            return "is a regression: its prediction is a number, with no class probability to fall short of"
        return None

    def top_predictions(self, outputs: list[Any]) -> list[tuple[str, float]]:
        """The label and its probability, at full precision where the output has it (predictions.jsonl
        shows it rounded; action=score's outputs read from a file have only what the file gives)."""
        return [(str(out), max((getattr(out, "exact", None) or out.probabilities).values())) for out in outputs]

    def score(self, outputs: list[Any], examples: list[dict]) -> dict[str, float]:
        golds = [ex["label"] for ex in examples]
        if self.regression:
            return regression_scores(outputs, golds, self.cfg.get("threshold"))  # F1 only where a threshold is set
        return classification_scores(outputs, golds, labels=self.labels)

    def write_outputs(self, run_dir: str, outputs: list[Any], examples: list[dict]) -> list[str]:
        """``probabilities.json``: each row's probabilities at full precision (``EXACT_PROBABILITIES``)."""
        if self.regression or not outputs or getattr(outputs[0], "exact", None) is None:
            return []
        path = os.path.join(run_dir, EXACT_PROBABILITIES)
        write_json_atomic(path, {"labels": list(outputs[0].exact),
                                 "rows": {str(ex["id"]): list(out.exact.values()) for out, ex in zip(outputs, examples)}})
        return [path]

    def prediction_records(self, outputs: list[Any], examples: list[dict]) -> list[dict]:
        """The input (text, and text_pair for pairs), the prediction, each label's probability
        (classification), and the gold label where the file has one."""
        records = []
        for out, ex in zip(outputs, examples):
            record = {"id": ex["id"], "text": ex["text"]}
            if "text_pair" in ex:
                record["text_pair"] = ex["text_pair"]
            record["prediction"] = out if self.regression else str(out)
            if getattr(out, "probabilities", None) is not None:
                record["probabilities"] = out.probabilities
            records.append(dict(record, **({"gold": ex["label"]} if "label" in ex else {})))
        return records


def exact_probabilities(path: str, records: dict[str, dict]) -> dict[str, dict[str, float]]:
    """``probabilities.json`` (``write_outputs``) read back for ``records`` (predictions.jsonl's, by id):
    id → {label: probability} at full precision, each checked against the file (one line naming the
    file and row where it is not: a row or label the predictions lack, a value that does not round to
    the one predictions.jsonl shows)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(path, None, f"not a JSON file of probabilities ({type(e).__name__})") from None
    labels, rows = (data.get("labels"), data.get("rows")) if isinstance(data, dict) else (None, None)
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels) or not isinstance(rows, dict):
        raise DataError(path, None, "expected {\"labels\": [label, ...], \"rows\": {id: [probability, ...]}}")
    if set(rows) != set(records):
        row = next(iter(sorted(set(rows) ^ set(records))))
        raise DataError(path, row, "its rows are not predictions.jsonl's: written by another run?")
    out = {}
    for row_id, values in rows.items():
        shown = records[row_id].get("probabilities")
        if not isinstance(values, list) or len(values) != len(labels) or not isinstance(shown, dict) \
                or set(shown) != set(labels):
            raise DataError(path, row_id, f"not one probability per label ({', '.join(labels)})")
        exact = {}
        for label, value in zip(labels, values):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise DataError(path, row_id, f"'{label}': {value!r} is not a probability")
            if not isinstance(shown[label], (int, float)) or abs(float(shown[label]) - value) > 0.6 * 10 ** -PROBABILITY_DIGITS:
                raise DataError(path, row_id, f"'{label}': {value!r} is not predictions.jsonl's {shown[label]!r} "
                                              "unrounded: written by another run?")
            exact[label] = float(value)
        out[row_id] = exact
    return out
