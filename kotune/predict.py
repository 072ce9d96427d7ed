"""Prediction and the one results schema: predict a split in length-sorted batches (input order
restored before decoding), write predictions.jsonl, and build the results body that train, eval
and predict share (every key always present)."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.build import Built, build
from kotune.runtime import is_rank_zero, local_rank_zero_first
from kotune.trainer import make_trainer
from tasks.errors import ConfigError
from tasks.io import write_jsonl_atomic
from tasks.log import log

REPORT_KEYS = ("n_train", "n_eval", "n_predict", "n_tune", "trainable_params", "total_params", "head_params",
               "mix_params",
               "max_length", "layers", "indices", "scalar_mix", "pooling", "cache", "encode_s",
               "head_train_s", "train_samples_per_second", "train_loss", "eval_samples_per_second",
               "checkpoint", "resumed_from", "best_step", "metrics_last", "early_stopping", "class_weights",
               "decision", "predictions_file", "metrics", "data")


def predict(trainer, b: Built, split: str) -> tuple[list, dict]:
    """Predict in batches sorted by length (little padding), then restore the input order:
    decoders read features row by row (QA windows per example), so they see the original order."""
    from tasks.collate import in_order, length_order, restore_order

    features = b.features[split]
    order = length_order(features)  # b.inputs[split] holds the same rows
    out = trainer.predict(in_order(b.inputs[split], order))
    outputs = b.task.decode(restore_order(out.predictions, order), features, b.splits[split].examples)
    speed = {"eval_samples_per_second": out.metrics.get("test_samples_per_second")}
    return outputs, speed


def fit_decision(trainer, b: Built) -> None:
    """After training: a task that holds a slice of the training data out (``Task.tune_fraction``,
    multi-label ``task.threshold=tune``) fits its decision on it; what training resolved goes into
    the model's saved ``task_options``, so that eval and predict of the checkpoint decide alike."""
    if "tune" in b.splits:
        outputs, _ = predict(trainer, b, "tune")
        b.task.fit_decision(outputs, b.splits["tune"].examples)
    b.model.meta.setdefault("task_options", {}).update(b.task.fitted_options())


def write_predictions(run_dir: str, b: Built, split: str, outputs: list) -> str:
    """predictions.jsonl in input order, plus the task's own files (QA: predictions.json)."""
    path = os.path.join(run_dir, "predictions.jsonl")
    write_jsonl_atomic(path, b.task.prediction_records(outputs, b.splits[split].examples))
    b.task.write_outputs(run_dir, outputs, b.splits[split].examples)
    return path


def run_report(cfg: DictConfig, run_dir: str, b: Built, split: str, outputs: list, speed: dict, **extra) -> dict:
    """The one results.json body of train, eval and predict: every key always present (None where
    it does not apply), so tables can be built over any mix of runs."""
    log(b.model.mixer.describe_mix())
    scored = split == "validation"
    report = dict.fromkeys(REPORT_KEYS)
    report.update(
        {f"n_{'eval' if s == 'validation' else s}": len(d.examples) for s, d in b.splits.items()},
        **b.model.param_counts(), **b.model.mixer.report(), max_length=b.max_length,
        pooling=getattr(b.model.head, "pooling", None), cache=b.cache_report or {"status": "off"},
        encode_s=b.cache_report.get("encode_s"), **speed, checkpoint=cfg.get("checkpoint"),
        class_weights=b.class_weights, decision=b.task.decision(),
        metrics=b.task.score(outputs, b.splits[split].examples) if scored else {},
        data={s: d.source for s, d in b.splits.items()})
    if (cfg.save_predictions or split == "predict") and is_rank_zero():
        report["predictions_file"] = write_predictions(run_dir, b, split, outputs)
    report.update(extra)
    unknown = set(report) - set(REPORT_KEYS)
    assert not unknown, f"results keys outside REPORT_KEYS: {unknown}"  # one schema for every action
    return report


def predict_from_checkpoint(cfg: DictConfig, run_dir: str, split: str, usage: str) -> dict:
    """Reload ``checkpoint=`` and predict one split (action=eval and action=predict)."""
    if not cfg.get("checkpoint"):
        raise ConfigError(usage)
    with local_rank_zero_first():
        b = build(cfg, (split,))
    outputs, speed = predict(make_trainer(cfg, b, run_dir), b, split)
    return run_report(cfg, run_dir, b, split, outputs, speed)
