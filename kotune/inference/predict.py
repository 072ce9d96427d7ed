"""Prediction and the one results schema: predict a split in length-sorted batches (input order
restored before decoding), write predictions.jsonl, and build the results body that train, eval
and predict share (every key always present).

One path for every model: a checkpoint's batches run through ``Trainer.predict``, an ONNX export's
(kotune/export/onnx.py) and the server's (kotune/serving/app.py) through :class:`BatchPredictor`, which gives
what ``Trainer.predict`` gives; the task's own decoding and records serve them all."""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig

from kotune.calibration import abstention
from kotune.loading.from_checkpoint import build_from_checkpoint
from kotune.loading.built import Built, make_collator
from heads.model import inference
from heads.model.inference import row_size, token_batches
from kotune.devices import is_rank_zero, local_rank_zero_first, world_size
from kotune.inference.model_runtimes import batch_forward, runtime_of
from tasks.base import IGNORE
from kotune.core.errors import ConfigError
from kotune.core.files import write_jsonl_atomic
from kotune.core.log import log

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


def concat_padded(parts: list) -> Any:
    """Batch outputs as one array per output, as ``Trainer.predict`` joins them: rows stacked, a
    token axis (axis 1) that differs between batches padded with -100 (decoders read real slots only)."""
    if isinstance(parts[0], tuple):
        return tuple(concat_padded([p[k] for p in parts]) for k in range(len(parts[0])))
    parts = [np.asarray(p) for p in parts]
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts)
    out = np.full((sum(len(p) for p in parts), max(p.shape[1] for p in parts), *parts[0].shape[2:]), IGNORE,
                  dtype=parts[0].dtype)
    row = 0
    for p in parts:
        out[row:row + len(p), : p.shape[1]] = p
        row += len(p)
    return out


class BatchPredictor:
    """``Trainer.predict`` for a model Trainer does not run: rows in the order given, ``batch_size``
    at a time (or, with ``batch_tokens``, as many as keep rows × padded length within it: a long
    request is split, never one batch past the budget), padded by the training collator, through
    ``forward`` (a padded batch → logits)."""

    def __init__(self, forward: Callable[[dict], Any], batch_size: int, collator, batch_tokens: int | None = None):
        self.forward, self.batch_size, self.collator = forward, max(1, int(batch_size)), collator
        self.batch_tokens = batch_tokens
        self.inference: inference.Inference | None = None  # set by batch_predictor: reported, not read

    def predict(self, rows):
        from transformers.trainer_utils import PredictionOutput

        started, parts = time.perf_counter(), []
        sizes = row_sizes(rows) if self.batch_tokens else [(1, 1)] * len(rows)  # no budget: batch_size rows
        for batch in token_batches(sizes, self.batch_tokens, self.batch_size, getattr(self.collator, "multiple", 1)):
            parts.append(self.forward(self.collator([rows[i] for i in batch])))  # rows read a batch at a time
        speed = len(rows) / max(time.perf_counter() - started, 1e-9)
        return PredictionOutput(predictions=concat_padded(parts), label_ids=None,
                                metrics={"test_samples_per_second": speed})


def row_sizes(rows) -> list[tuple[int, int]]:
    """Each row's (sequences, longest) for the token budget: from the token column alone where the rows
    are a ``datasets.Dataset`` (training's budget reads it so: kotune/training/token_budget.py), else row by row."""
    if getattr(rows, "column_names", None) is not None:
        from kotune.training.token_budget import feature_sizes

        return feature_sizes(rows)
    return [row_size(rows[i]) for i in range(len(rows))]


def batch_predictor(cfg: DictConfig, model, tokenizer) -> BatchPredictor:
    """The job's :class:`BatchPredictor` over ``model``: its runtime's forward on ``predict.device`` and
    ``predict.precision`` (heads/model/inference.py), ``train.eval_batch_size`` rows or
    ``predict.batch_tokens`` tokens a batch. Serve, ``kotune.load``, rerank and the teacher's score use it."""
    options, chosen = cfg.get("predict") or {}, inference.of(cfg)
    predictor = BatchPredictor(batch_forward(model, chosen), int(cfg.train.eval_batch_size),
                               make_collator(tokenizer, cfg), inference.check_batch_tokens(options.get("batch_tokens")))
    predictor.inference = chosen
    return predictor


def inference_report(model, predictor) -> dict:
    """Where the batches ran (results.json ``inference``, serve's /health): the device, precision and
    token budget; an ONNX export's execution provider; ``trainer`` when Trainer ran them."""
    if not isinstance(predictor, BatchPredictor):  # Trainer: train.* (bf16, fp16, use_cpu) decide
        args = predictor.args
        precision = "bf16" if args.bf16_full_eval else "fp16" if args.fp16_full_eval else "fp32"
        return {"device": str(args.device), "precision": precision, "batch_tokens": None, "provider": None,
                "runner": "trainer"}
    chosen = predictor.inference or inference.Inference()
    return {**chosen.describe(), "batch_tokens": predictor.batch_tokens,
            "provider": getattr(model, "provider", None), "runner": "kotune"}


def outside_trainer(cfg: DictConfig) -> bool:
    """Whether a checkpoint's eval/predict runs through :func:`batch_predictor` rather than Trainer:
    when ``predict.device``, ``precision`` or ``batch_tokens`` is set (Trainer reads train.*). One
    process: under torchrun they are refused in one line."""
    options = cfg.get("predict") or {}
    chosen = [f"predict.{k}={options.get(k)}" for k, default in (("device", "auto"), ("precision", "fp32"),
                                                                  ("batch_tokens", None))
              if options.get(k, default) not in (default, None)]
    if chosen and world_size() > 1:
        raise ConfigError(f"{', '.join(chosen)}: set for one process; under torchrun evaluation runs in "
                          "Trainer on every rank (leave predict.device, precision and batch_tokens unset)")
    return bool(chosen)


def predictor_for(cfg: DictConfig, b: Built, run_dir: str):
    """What runs the batches, as the model's runtime says (kotune/inference/model_runtimes.py): Trainer for a
    checkpoint (unless :func:`outside_trainer`), :class:`BatchPredictor` for an ONNX export."""
    if not runtime_of(b.model).trainer or outside_trainer(cfg):
        return batch_predictor(cfg, b.model, b.tokenizer)
    from kotune.training.trainer import prediction_trainer  # transformers' Trainer: loaded once a model is to run

    return prediction_trainer(cfg, b, run_dir)


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


def write_predictions(run_dir: str, b: Built, split: str, outputs: list, abstained: list | None = None) -> str:
    """predictions.jsonl in input order, plus the task's own files (QA: predictions.json);
    ``abstained``: per row, whether it abstains (predict.min_confidence: kotune/calibration/abstention.py)."""
    path = os.path.join(run_dir, "predictions.jsonl")
    records = b.task.prediction_records(outputs, b.splits[split].examples)
    write_jsonl_atomic(path, abstention.mark(records, abstained))
    b.task.write_outputs(run_dir, outputs, b.splits[split].examples)
    return path


def run_report(cfg: DictConfig, run_dir: str, b: Built, split: str, outputs: list, speed: dict, **extra) -> dict:
    """The one results.json body of train, eval and predict: every key always present (None where
    it does not apply), so tables can be built over any mix of runs."""
    log(b.model.describe())
    scored, threshold = split == "validation", abstention.min_confidence(cfg, b.task)
    report = dict.fromkeys(REPORT_KEYS)
    report.update(
        {f"n_{'eval' if s == 'validation' else s}": len(d.examples) for s, d in b.splits.items()},
        # the kind and its options ("token (crf=true)": the CRF named in the closing table); an ONNX export's kind
        head=b.model.head_description(),
        **b.model.report(), max_length=b.max_length, cache=b.cache_report or {"status": "off"},
        encode_s=b.cache_report.get("encode_s"), **speed, checkpoint=cfg.get("checkpoint"),
        class_weights=b.class_weights, decision=b.task.decision(),
        metrics=b.task.score(outputs, b.splits[split].examples) if scored else {},
        data={s: d.source for s, d in b.splits.items()},
        abstention=abstention.report(threshold, b.task, outputs, b.splits[split].examples, scored,
                                     run_dir if is_rank_zero() else None))
    if (cfg.save_predictions or split == "predict") and is_rank_zero():
        report["predictions_file"] = write_predictions(run_dir, b, split, outputs,
                                                       abstention.abstained(threshold, b.task, outputs))
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
    return run_report(cfg, run_dir, b, split, outputs, speed, inference=inference_report(b.model, predictor))
