"""Prediction and the one results schema: predict a split in length-sorted batches (input order
restored before decoding), write predictions.jsonl, and build the results body that train, eval
and predict share (every key always present).

One path for every model: what runs the batches (``Trainer.predict``, or a BatchPredictor for an ONNX
export, the server and ``predict.device``/``precision``/``batch_tokens``) is chosen in
kotune/inference/model_runtimes.py; the task's own decoding and records serve them all."""
from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from kotune.calibration.abstention import write_plot
from kotune.loading.from_checkpoint import build_from_checkpoint
from kotune.loading.built import Built
from kotune.devices import is_rank_zero, local_rank_zero_first
from kotune.inference.model_runtimes import predictor_for
from tasks.abstention import assess, mark
from kotune.core.errors import ConfigError
from kotune.core.files import write_jsonl_atomic
from kotune.core.log import log

PREDICTIONS_FILE = "predictions.jsonl"
REPORT_KEYS = ("head", "n_train", "n_eval", "n_predict", "n_tune", "n_select", "n_calibrate", "trainable_params",
               "total_params",
               "head_params", "mix_params",
               "max_length", "layers", "indices", "scalar_mix", "pooling", "cache", "encode_s",
               "head_train_s", "train_samples_per_second", "train_loss", "eval_samples_per_second",
               "checkpoint", "onnx_file", "resumed_from", "best_step", "selected_on", "metrics_last", "early_stopping",
               "pruned",
               "class_weights",
               "calibration", "distill", "setfit",
               "decision", "abstention", "inference", "predictions_file", "metrics", "data")


def predict_rows(predictor, task, features, inputs, examples: list[dict]) -> tuple[list, dict]:
    """Predict in batches sorted by length (little padding), then restore the input order:
    decoders read features row by row (QA windows per example), so they see the original order."""
    predictions, speed = predict_logits(predictor, features, inputs)
    return task.decode(predictions, features, examples), speed


def predict_logits(predictor, features, inputs) -> tuple[Any, dict]:
    """The model's outputs for ``inputs`` in input order, run in batches sorted by length (little
    padding), and the speed; :func:`predict_rows` decodes them, action=rerank scores them."""
    from tasks.collate import in_order, length_order, restore_order

    order = length_order(features)  # inputs holds the same rows
    out = predictor.predict(in_order(inputs, order))
    return restore_order(out.predictions, order), {"eval_samples_per_second": out.metrics.get("test_samples_per_second")}


def predict(trainer, b: Built, split: str) -> tuple[list, dict]:
    return predict_rows(trainer, b.task, b.features[split], b.inputs[split], b.splits[split].examples)


def fit_decision(trainer, b: Built) -> None:
    """After training (and, through ``KotuneTrainer.before_evaluation``, before each evaluation
    during it): a task that holds a slice of the training data out (``Task.tune_fraction``,
    multi-label ``task.threshold=tune``) fits its decision on it; what training resolved goes into
    the model's saved ``task_options``, so that eval and predict of the checkpoint decide alike."""
    if "tune" in b.splits:
        # Trainer's compute_metrics scores the evaluation split's rows: off for the slice's
        scoring, trainer.compute_metrics = trainer.compute_metrics, None
        try:
            outputs, _ = predict(trainer, b, "tune")
        finally:
            trainer.compute_metrics = scoring
        b.task.fit_decision(outputs, b.splits["tune"].examples)
    b.model.meta.setdefault("task_options", {}).update(b.task.fitted_options())


def run_report(cfg: DictConfig, run_dir: str, b: Built, split: str, outputs: list, speed: dict, **extra) -> dict:
    """The one results.json body of train, eval and predict: every key always present (None where
    it does not apply), so tables can be built over any mix of runs. Where asked
    (``save_predictions``; always for action=predict), predictions.jsonl in input order, every record
    marked abstained or not where predict.min_confidence is set, and the task's own files (QA:
    predictions.json)."""
    log(b.model.describe())
    scored, examples = split == "validation", b.splits[split].examples
    writing = (cfg.save_predictions or split == "predict") and is_rank_zero()
    abstention = assess(b.min_confidence, b.task, outputs, examples, scored)
    records = mark(b.task.prediction_records(outputs, examples), abstention.flags) if writing else None
    if abstention.curve and is_rank_zero():
        abstention.entry["plot"] = write_plot(run_dir, abstention.curve, abstention.entry, b.task.name)
    report = dict.fromkeys(REPORT_KEYS)
    report.update(
        {f"n_{'eval' if s == 'validation' else s}": len(d.examples) for s, d in b.splits.items()},
        # the kind and its options ("token (crf=true)": the CRF named in the closing table); an ONNX export's kind
        head=b.model.head_description(),
        **b.model.report(), max_length=b.max_length, cache=b.cache_report or {"status": "off"},
        encode_s=b.cache_report.get("encode_s"), **speed, checkpoint=cfg.get("checkpoint"),
        class_weights=b.class_weights, decision=b.task.decision(),
        metrics=b.task.score(outputs, examples) if scored else {},
        data={s: d.source for s, d in b.splits.items()}, abstention=abstention.entry)
    if records is not None:
        report["predictions_file"] = os.path.join(run_dir, PREDICTIONS_FILE)
        write_jsonl_atomic(report["predictions_file"], records)
        b.task.write_outputs(run_dir, outputs, examples)
    report.update(extra)
    unknown = set(report) - set(REPORT_KEYS)
    assert not unknown, f"results keys outside REPORT_KEYS: {unknown}"  # one schema for every action
    return report


def predict_from_checkpoint(cfg: DictConfig, run_dir: str, split: str, usage: str) -> dict:
    """Reload ``checkpoint=`` (a kotune checkpoint or an ONNX export) and predict one split
    (action=eval and action=predict)."""
    if not cfg.get("checkpoint"):
        raise ConfigError(usage)
    with local_rank_zero_first():
        b = build_from_checkpoint(cfg, (split,), onnx=True)
    predictor = predictor_for(cfg, b, run_dir)
    outputs, speed = predict(predictor, b, split)
    return run_report(cfg, run_dir, b, split, outputs, speed, inference=predictor.inference_report())
