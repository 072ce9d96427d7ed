"""Multi-label classification (``task=multi_label``): a set of labels per text (or text pair), zero
or more, from a fixed label set (``task.labels``, or learned from the training split, sorted).

Reading: a JSON/JSONL label field is a list (``[]``: no label); a CSV/TSV cell is one string split
at ``task.label_separator`` (empty: no label). ``data.label_column`` may name several columns,
whose labels are pooled into one set (the hate-speech corpus: ``bias`` and ``hate``); values in
``task.no_label`` (e.g. ``none``) mean "no label" in any column.

Model: the sequence / pair head with a sigmoid per label, trained with a binary cross-entropy per
label on multi-hot targets, as ``*ForSequenceClassification`` computes it for
``problem_type="multi_label_classification"`` (so the head exports to that class).

Decision: a label is predicted when its probability is at least its threshold:
``task.threshold=tune`` (the presets' default): ``task.tune_fraction`` of the training examples
(seeded, grouped as any split is) is held out of training and picks each label's threshold, the one
with the best F1 of that label on the slice, at every evaluation during training (so that
``train.select_best`` and early stopping compare checkpoints by the decision they will keep) and
after training; or null (0.5), a number, a list with one per label. At eval/predict of a checkpoint,
null and ``tune`` mean the checkpoint's own thresholds. The evaluation split never chooses anything.
The chosen thresholds are saved with the model.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from omegaconf import ListConfig

from kotune.core.registry import register_task
from tasks.classification import ClassificationTask
from kotune.core.errors import ConfigError, DataError
from tasks.io import field
from tasks.metric_sets import multi_label_scores
from kotune.core.log import log, warn
from tasks.outputs import probability_row

TUNE = "tune"
DEFAULT_THRESHOLD = 0.5


def check_threshold(value: Any) -> float | list[float] | str | None:
    """``task.threshold`` checked: None, ``tune``, a probability, or a list of them (one per label)."""
    if value is None or value == TUNE:
        return value
    several = isinstance(value, (list, tuple, ListConfig))
    for v in (list(value) if several else [value]):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
            raise ConfigError(f"task.threshold={value}: expected tune, a probability in [0, 1] or a list of them "
                              "(one per label)")
    return [float(v) for v in value] if several else float(value)


def best_thresholds(probs: list[list[float]], golds: list[list[bool]]) -> list[float]:
    """Per label (column), the threshold with the best F1 of that label: each candidate predicts the
    examples whose probability is at least it, and the candidates lie midway between consecutive
    distinct probabilities (below the lowest: half of it), so every distinct cut is tried once. Ties
    go to the highest threshold (the fewest predicted labels); a label with no positive example keeps
    ``DEFAULT_THRESHOLD`` (nothing to tune it on)."""
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(golds, dtype=bool)
    out = []
    for j in range(p.shape[1]):
        positives = int(y[:, j].sum())
        if positives == 0:
            out.append(DEFAULT_THRESHOLD)
            continue
        order = np.argsort(-p[:, j], kind="mergesort")
        scores, hits = p[order, j], y[order, j]
        last = np.r_[np.nonzero(np.diff(scores))[0], len(scores) - 1]  # the last row of each distinct score
        tp = np.cumsum(hits)[last]
        predicted = last + 1
        f1 = 2 * tp / (predicted + positives)
        best = int(np.argmax(f1))  # the first maximum: the highest threshold
        below = scores[last[best] + 1] if last[best] + 1 < len(scores) else 0.0
        out.append(float((scores[last[best]] + below) / 2))
    return out


@register_task("multi_label")
class MultiLabelTask(ClassificationTask):
    """A set of labels per example; outputs are ``{"labels": [...], "probs": [...]}``."""

    def abstention_refusal(self) -> str | None:  # predict.min_confidence (tasks/abstention.py)
        return ("is multi-label: each label is decided on its own probability against task.threshold "
                "(raise it to answer less)")

    multi_label = True
    # the decision is saved with the model: eval/predict of a checkpoint decide as its training did
    saved_options = {"regression": "error", "multi_label": "error", "threshold": "auto"}
    # requested values that, for a checkpoint, mean what training resolved (kotune/loading/build.py)
    checkpoint_resolves = {"threshold": (TUNE,)}

    def __init__(self, cfg):
        super().__init__(cfg)
        if self.regression:
            raise ConfigError("task.regression=true: a multi-label task classifies (a sigmoid per label)")
        self.cfg.multi_label = True
        self.separator = str(cfg.get("label_separator") or ",")
        no_label = cfg.get("no_label")
        self.no_label = {str(no_label)} if isinstance(no_label, str) else {str(v) for v in (no_label or [])}
        self.threshold = check_threshold(cfg.get("threshold"))
        self.tuned: list[float] | None = None
        self.tune_report: dict = {}

    # ---- reading -------------------------------------------------------------------------
    def label_columns(self) -> dict[str, str]:
        column = self.cfg.columns.label
        names = [str(column)] if isinstance(column, str) else [str(c) for c in column]
        return {("label" if i == 0 else f"label{i + 1}"): name for i, name in enumerate(names)}

    @property
    def column_options(self) -> dict[str, str]:
        options = super().column_options
        return {**options, **{role: "data.label_column" for role in self.label_columns() if role != "label"}}

    def read_label(self, path: str, where: str, row: dict, ex: dict, labelled: bool) -> None:
        """``ex["label"]``: the label set pooled from every label column (absent from an unlabelled
        predict file that lacks them); ``ex["row"]`` keeps the row for later messages."""
        columns = list(self.label_columns().values())
        if not labelled and not all(_has(row, c) for c in columns):
            return
        names: list[str] = []
        for column in columns:
            names += self.parse_labels(path, where, field(path, where, row, column))
        ex["label"] = list(dict.fromkeys(n for n in names if n not in self.no_label))
        ex["row"] = where
        if self.labels is not None:
            self._check_known(path, where, ex["label"])

    def parse_labels(self, path: str, where: str, value: Any) -> list[str]:
        """A label set as written: a JSON list, a JSON list in a text cell, or one string split at
        ``task.label_separator``; null or empty: no label."""
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise DataError(path, where, f"label cell {value[:40]!r} starts like a JSON list but is not one") \
                    from None
        if value is None:
            return []
        if isinstance(value, str):
            return [part.strip() for part in value.split(self.separator) if part.strip()]
        if isinstance(value, (list, tuple)):
            if any(isinstance(v, (dict, list, tuple)) or v is None for v in value):
                raise DataError(path, where, f"labels {value!r}: expected a list of label names")
            return [str(v).strip() for v in value if str(v).strip()]
        if isinstance(value, dict):
            raise DataError(path, where, f"labels {value!r}: expected a list of label names or a "
                                         f"'{self.separator}'-separated string")
        return [str(value)]

    def _check_known(self, path: str, where: Any, names: list[str]) -> None:
        unknown = [n for n in names if n not in self.labels]
        if unknown:
            raise DataError(path, where, f"unknown label '{unknown[0]}' (labels: {', '.join(self.labels)})")

    def fit_labels(self, train: list[dict]) -> None:
        self.warn_single_label(train)
        if self.labels is None:
            self.labels = sorted({name for ex in train for name in ex.get("label", [])})
            if not self.labels:
                raise ConfigError(f"task {self.name}: every training example has an empty label set: "
                                  "there is no label to learn")

    def warn_single_label(self, train: list[dict]) -> None:
        """A single-label file read as multi-label trains without an error: every row then holds
        exactly one label, a placeholder such as ``none`` becomes a label of its own, and a sigmoid
        per class learns what a softmax over them would. Say so, and what to use instead."""
        sets = [ex["label"] for ex in train if "label" in ex]
        if len(sets) < 2 or any(len(labels) != 1 for labels in sets):
            return
        names = sorted({labels[0] for labels in sets})
        shown = ", ".join(names[:8]) + (f", … ({len(names)} in all)" if len(names) > 8 else "")
        warn(f"task={self.name}: every one of the {len(sets)} training examples holds exactly one label ({shown}): "
             "a single-label file? task=text_cls trains one softmax over these classes; if a value means 'no "
             "label' (none), name it in task.no_label=[none]")

    def check_labels(self, examples: list[dict], path: str) -> None:
        """Labels learned from the training split: another split's labels must be among them."""
        for ex in examples:
            if "label" in ex:
                self._check_known(path, ex.get("row", ex["id"]), ex["label"])

    def head_kwargs(self) -> dict:
        return {"num_labels": len(self.labels), "multi_label": True}

    def label_values(self, examples: list[dict]) -> list[list[float]]:
        """Multi-hot targets in label order (BCE's float labels)."""
        index = {name: i for i, name in enumerate(self.labels)}
        rows = []
        for ex in examples:
            row = [0.0] * len(self.labels)
            for name in ex["label"]:
                row[index[name]] = 1.0
            rows.append(row)
        return rows

    # ---- the decision --------------------------------------------------------------------
    @property
    def tune_fraction(self) -> float:
        if self.threshold != TUNE:
            return 0.0
        return float(self.cfg.get("tune_fraction") or 0.1)

    def thresholds(self) -> list[float]:
        """Each label's threshold. ``tune`` decides with the thresholds tuned last: at each
        evaluation during training those tuned on the slice's predictions of the weights evaluated
        (kotune/training/trainer.py), after training those of the weights kept; before any tuning at 0.5."""
        k = len(self.labels)
        if isinstance(self.threshold, list):
            if len(self.threshold) != k:
                raise ConfigError(f"task.threshold has {len(self.threshold)} values, but the task has {k} labels "
                                  f"({', '.join(self.labels)}): give one per label, in that order")
            return list(self.threshold)
        if self.threshold == TUNE:
            return list(self.tuned) if self.tuned is not None else [DEFAULT_THRESHOLD] * k
        return [DEFAULT_THRESHOLD if self.threshold is None else float(self.threshold)] * k

    def fit_decision(self, outputs: list[dict], examples: list[dict]) -> None:
        """``task.threshold=tune``: each label's threshold from the held-out training slice's
        predictions (at each evaluation during training and once after it)."""
        golds = [[name in set(ex["label"]) for name in self.labels] for ex in examples]
        probs = [out["probs"] for out in outputs]
        before = self.score(outputs, examples)["micro_f1"]
        self.tuned = best_thresholds(probs, golds)
        after = self.score(self.decide(probs), examples)["micro_f1"]
        self.tune_report = {"tune_examples": len(examples), "tune_micro_f1_at_0.5": before, "tune_micro_f1": after}
        log(f"thresholds tuned on {len(examples)} held-out training examples (micro F1 {before:.2f} at 0.5 → "
            f"{after:.2f}): " + ", ".join(f"{n} {t:.3f}" for n, t in zip(self.labels, self.tuned)))

    def fitted_options(self) -> dict:
        """What training resolved, saved with the model: the thresholds that decide."""
        return {"threshold": self.thresholds()}

    def decision(self) -> dict:
        if self.threshold == TUNE and self.tuned is None:
            raise ConfigError("task.threshold=tune: thresholds are tuned in training (action=train), and a "
                              "checkpoint's are its own; here there are none: give a number")
        return {"threshold": self.threshold, "thresholds": dict(zip(self.labels, self.thresholds())),
                **self.tune_report}

    def decide(self, probs: list[list[float]]) -> list[dict]:
        cut = np.asarray(self.thresholds(), dtype=np.float64)
        return [{"labels": [self.labels[j] for j in np.nonzero(np.asarray(row) >= cut)[0]], "probs": list(row)}
                for row in probs]

    # ---- decoding and scoring ------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[dict]:
        logits = np.asarray(predictions, dtype=np.float64).reshape(len(examples), -1)
        return self.decide((1.0 / (1.0 + np.exp(-logits))).tolist())

    def score(self, outputs: list[dict], examples: list[dict]) -> dict[str, float]:
        return multi_label_scores([o["labels"] for o in outputs], [ex["label"] for ex in examples], self.labels)

    def prediction_records(self, outputs: list[dict], examples: list[dict]) -> list[dict]:
        """The text, the predicted label set and every label's probability (full precision, unlike the
        single-label tasks' 4 digits: ``action=score`` decides again from them at another
        ``task.threshold``, exactly as the model would)."""
        return [{"id": ex["id"], "text": ex["text"], "prediction": out["labels"],
                 "probabilities": dict(zip(self.labels, out["probs"])), **({"gold": ex["label"]} if "label" in ex else {})}
                for out, ex in zip(outputs, examples)]

    def outputs_from_predictions(self, values: list, examples: list[dict], path: str) -> list[dict]:
        """A label set per example (its probabilities where the file has them)."""
        return self.outputs_from(values, [getattr(v, "probabilities", None) for v in values], examples, path)

    def outputs_from(self, values: list, probabilities: list, examples: list[dict], path: str) -> list[dict]:
        """``action=score``: a file's predicted label sets (a list, or a separated string) as outputs;
        with ``task.threshold`` given, decided again from the file's probabilities."""
        outputs = []
        for value, probs, ex in zip(values, probabilities, examples):
            where = f"id {ex['id']!r}"
            names = self.parse_labels(path, where, value)
            self._check_known(path, where, names)
            outputs.append({"labels": names,
                            "probs": None if probs is None else probability_row(probs, self.labels, path, where)})
        if self.threshold is None or self.threshold == TUNE:  # tune: the thresholds the system decided with
            return outputs
        if any(o["probs"] is None for o in outputs):
            raise DataError(path, None, f"task.threshold={self.threshold} decides from each label's probability: "
                                        "the file has no 'probabilities' ({label: probability} per row)")
        return self.decide([o["probs"] for o in outputs])


def _has(row: dict, dotted: str) -> bool:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True
