"""``action=score``: any system's predictions (``score.predictions``) against the gold
``data.validation_file``, with the task's own metrics (tasks/score.py reads and checks them)."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from tasks import build_task
from tasks.splits import load_splits
from kotune.core.errors import ConfigError
from kotune.core.errors import DataError
from tasks.score import ABSTAINED, align, read_predictions


def run(cfg: DictConfig, run_dir: str) -> dict:
    if not cfg.score.get("predictions"):
        raise ConfigError("action=score needs score.predictions=FILE and the gold file as data.validation_file=FILE")
    task = build_task(cfg.task)
    gold = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))["validation"]
    task.fit_labels(gold.examples)  # a label set learned from data (text_cls, token_cls): the gold file's
    path = str(cfg.score.predictions)
    predicted = read_predictions(path, str(cfg.score.id_column), cfg.score.get("prediction_column"),
                                 cfg.score.get("format"))
    values = align(predicted, [str(ex["id"]) for ex in gold.examples], path, gold.where)
    # rows that abstained (predict.min_confidence) are left out of the scores; the entry says how many
    kept = [i for i, v in enumerate(values) if v != ABSTAINED]
    examples = [gold.examples[i] for i in kept]
    outputs = task.outputs_from_predictions([values[i] for i in kept], examples, path)
    metrics = task.score(outputs, examples) if kept else {}
    abstained = None if len(kept) == len(values) else scored_abstention(task, values, gold.examples, kept, metrics, path)
    return {"n_eval": len(values), "predictions_file": os.path.abspath(path), "metrics": metrics,
            "abstention": abstained, "data": {"validation": gold.source}}


def scored_abstention(task, values: list, gold: list[dict], kept: list[int], metrics: dict, path: str) -> dict:
    """results.json's ``abstention`` for a file with abstained rows: coverage, and the answered rows'
    accuracy, risk and metrics (the file does not say its threshold; no curve: the abstained rows'
    answers are not read)."""
    from tasks.abstention import REPORT_FIELDS, coverage, risk

    why = task.abstention_refusal()
    if why:
        raise DataError(path, None, f"{len(values) - len(kept)} rows abstained: task {task.name} {why}")
    flags = [v == ABSTAINED for v in values]
    correct = [not f and str(v) == str(ex["label"]) for v, f, ex in zip(values, flags, gold)]
    entry = dict.fromkeys(REPORT_FIELDS)
    entry.update(n=len(values), answered=len(kept), coverage=coverage(flags), risk=risk(correct, flags),
                 metrics=metrics or None)
    entry["accuracy"] = None if entry["risk"] is None else 100.0 * (1.0 - entry["risk"])
    return entry
