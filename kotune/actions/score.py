"""``action=score``: any system's predictions (``score.predictions``) against the gold
``data.validation_file``, with the task's own metrics (tasks/score.py reads and checks them)."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from tasks import build_task
from tasks.splits import load_splits
from kotune.core.errors import ConfigError
from tasks.score import align, read_predictions


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
    outputs = task.outputs_from_predictions(values, gold.examples, path)
    return {"n_eval": len(outputs), "predictions_file": os.path.abspath(path),
            "metrics": task.score(outputs, gold.examples), "data": {"validation": gold.source}}
