"""kotune's command line: ``python run.py task=nli model=klue`` (Hydra; see conf/).

compose config → read task data → tokenizer + encoder + head → transformers.Trainer → decode →
KLUE metrics → ``results.json`` (atomic) in the run directory, plus the model and predictions.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import sys
import time
import warnings
from typing import Any, Callable

import hydra
from omegaconf import DictConfig, OmegaConf

from tasks import build_task
from tasks.base import EncodeSettings, Split, Task, encode_cached, fingerprint, load_splits
from tasks.errors import ConfigError, KotuneError
from tasks.io import write_json_atomic, write_jsonl_atomic
from tasks.log import log

CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
GROUPS = ("task", "model", "mode", "train", "data")
UNK_WARN_RATE = 0.05


# ---- building blocks -----------------------------------------------------------------------
def requested_max_length(cfg: DictConfig) -> int:
    """``task.max_length`` where the task sets one (QA windows: 384), else ``train.max_length``."""
    return int(cfg.task.get("max_length") or cfg.train.max_length)


def resolve_max_length(requested: int, encoder_config) -> int:
    from heads.encoder import position_limit

    limit = position_limit(encoder_config)
    if requested > limit:
        log(f"max_length={requested} exceeds the model's {limit} positions: using {limit}")
        return limit
    return requested


def warn_unknown_hangul(tokenizer, texts) -> float:
    from heads.encoder import unk_rate

    rate = unk_rate(tokenizer, texts)
    if rate > UNK_WARN_RATE:
        log(f"WARNING: the tokenizer maps {rate:.0%} of Hangul syllables to [UNK]. A cased Korean "
            "vocabulary loaded with lowercasing/accent stripping decomposes Hangul into jamo: set "
            "model.tokenizer_kwargs.do_lower_case=false")
    return rate


def make_collator(tokenizer, cfg: DictConfig):
    from tasks.collate import DynamicPaddingCollator

    return DynamicPaddingCollator(tokenizer.pad_token_id, pad_multiple(cfg.train))


def pad_multiple(t: DictConfig) -> int:
    """``train.pad_to_multiple_of``; ``auto``: 8 on CUDA (tensor-core tiles), 1 on CPU, where
    rounding up buys nothing and costs ~8 % of the tokens of short KLUE sentences."""
    import torch

    value = t.get("pad_to_multiple_of", "auto")
    if value in (None, "auto"):
        return 8 if torch.cuda.is_available() else 1
    return max(1, int(value))


def dataloader_workers(t: DictConfig) -> int:
    """``train.dataloader_num_workers``; ``auto``: 2 per process on CUDA (collation overlaps the
    GPU step), 0 on CPU, where a worker would take a core from the matmuls."""
    import torch

    value = t.get("dataloader_num_workers", "auto")
    if value in (None, "auto"):
        return min(2, os.cpu_count() or 1) if torch.cuda.is_available() else 0
    return int(value)


def cpu_only() -> bool:
    """No accelerator: accelerate then needs ``cpu=True`` to run gloo DDP under torchrun (else
    every process trains alone on all the data) and to autocast bf16 on the CPU."""
    import torch

    return not torch.cuda.is_available() and not torch.backends.mps.is_available()


@contextlib.contextmanager
def local_rank_zero_first():
    """Under torchrun: each machine's rank 0 builds first (trains the tokenizer, encodes, fills
    the caches) while its other ranks wait, then reads what it wrote: no two processes write one
    cache entry, and the data is tokenized once per machine, not once per process."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        yield
        return
    from accelerate import PartialState

    with PartialState(cpu=cpu_only()).local_main_process_first():
        yield


def training_arguments(cfg: DictConfig, run_dir: str, task: Task, do_eval: bool):
    import torch
    from transformers import TrainingArguments

    t = cfg.train
    precision = str(t.precision)
    if precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision must be fp32, bf16 or fp16, got '{precision}'")
    cuda = torch.cuda.is_available()
    if precision == "fp16" and not cuda:
        raise ConfigError("train.precision=fp16 needs a CUDA GPU (autocast with a loss scaler); "
                          "on CPU use bf16 or fp32")
    workers = dataloader_workers(t)
    return TrainingArguments(
        output_dir=os.path.join(run_dir, "checkpoints"),
        learning_rate=float(t.learning_rate),
        num_train_epochs=float(t.epochs),
        max_steps=int(t.max_steps),
        per_device_train_batch_size=int(t.batch_size),
        per_device_eval_batch_size=int(t.eval_batch_size),
        gradient_accumulation_steps=int(t.grad_accum),
        warmup_steps=float(t.warmup_ratio),  # < 1: a fraction of the total steps
        weight_decay=float(t.weight_decay),
        seed=int(t.seed),
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        torch_compile=bool(t.get("compile", False)),
        eval_strategy=str(t.eval_strategy) if do_eval else "no",
        save_strategy=str(t.save_strategy),
        logging_steps=int(t.logging_steps),
        report_to="none",
        remove_unused_columns=False,  # features carry only model inputs; ids stay outside
        label_names=list(task.label_fields),
        train_sampling_strategy="group_by_length" if t.group_by_length else "random",
        use_cpu=cpu_only(),
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,  # not re-forked for every evaluation
        dataloader_pin_memory=cuda,
        ddp_find_unused_parameters=bool(cfg.mode.frozen) or None,
        disable_tqdm=not sys.stderr.isatty() and os.environ.get("KOTUNE_PROGRESS", "1") == "0",
    )


class Built:
    """Everything one run needs: task, splits, tokenizer, model, features."""

    def __init__(self, task: Task, splits: dict[str, Split], tokenizer, model, features: dict, max_length: int):
        self.task, self.splits, self.tokenizer, self.model = task, splits, tokenizer, model
        self.features, self.max_length = features, max_length
        # what Trainer reads per split: the model columns, or with them cached frozen states
        self.inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
        self.cache_report: dict = {}


def build(cfg: DictConfig, need: tuple[str, ...]) -> Built:
    from heads.encoder import load_encoder, load_tokenizer, uses_token_type_ids
    from heads.model import KotuneModel

    task = build_task(cfg.task)
    seed = int(cfg.train.seed)
    if cfg.get("checkpoint"):
        model_dir = checkpoint_model_dir(cfg.checkpoint)
        model = KotuneModel.load(model_dir)
        if model.head_kind != task.head:  # e.g. QA's task.decode=char needs the span_char head
            raise ConfigError(f"checkpoint {cfg.checkpoint} has a '{model.head_kind}' head; task {task.name} "
                              f"with these options needs '{task.head}' (use the task options it was trained with)")
        task.labels = model.meta.get("labels", task.labels)
        splits = load_splits(task, cfg.data, need, seed)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        max_length = int(model.meta.get("max_length", requested_max_length(cfg)))
    else:
        splits = load_splits(task, cfg.data, need, seed)
        if "train" in splits:
            task.fit_labels(splits["train"].examples)
            if hasattr(task, "check_labels") and "validation" in splits:
                task.check_labels(splits["validation"].examples, str(splits["validation"].source))
        first = splits.get("train") or next(iter(splits.values()))
        log("loading tokenizer")
        tokenizer = load_tokenizer(cfg.model, texts=task.training_texts(first.examples),
                                   cache_dir=cfg.cache_dir)
        warn_unknown_hangul(tokenizer, task.training_texts(first.examples))
        log(f"building encoder ({cfg.model.init}: {cfg.model.name_or_path or cfg.model.name})")
        encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=seed, head_kind=task.head)
        max_length = resolve_max_length(requested_max_length(cfg), encoder.config)
        head_kwargs = dict(task.head_kwargs(), dropout=cfg.train.get("head_dropout"))  # None: the architecture's
        meta = {"task": task.name, "labels": task.labels, "max_length": max_length,
                "token_type_ids": uses_token_type_ids(encoder.config), "model": cfg.model.name}
        model = KotuneModel(encoder, task.head, head_kwargs, frozen=bool(cfg.mode.frozen), meta=meta,
                            layers=cfg.mode.get("layers", "last"), pooling=cfg.mode.get("pooling"))
    settings = EncodeSettings(max_length=max_length, token_type_ids=bool(model.meta["token_type_ids"]))
    features = {}
    for split, data in splits.items():
        log(f"encoding {split}: {len(data.examples)} examples")
        features[split] = encode_cached(task, data.examples, tokenizer, settings, cfg.cache_dir)
    built = Built(task, splits, tokenizer, model, features, max_length)
    if cfg.mode.get("cache") and (model.frozen or not cfg.get("checkpoint")):
        use_frozen_cache(cfg, built)
    return built


def use_frozen_cache(cfg: DictConfig, b: Built) -> None:
    """``mode.cache``: encode each split once with the frozen encoder; Trainer then reads the
    stored states (heads/feature_cache.py)."""
    from heads.feature_cache import CacheSettings, cached_inputs
    from tasks.base import tokenizer_fingerprint

    if not cfg.get("cache_dir"):
        raise ConfigError("mode.cache=true needs cache_dir=DIR (where frozen features are stored)")
    settings = CacheSettings(str(cfg.cache_dir), str(cfg.mode.get("cache_dtype", "float16")),
                             float(cfg.mode.get("cache_max_gb", 20)), int(cfg.train.eval_batch_size))
    identity = {"model": b.model.meta.get("model"), "tokenizer": tokenizer_fingerprint(b.tokenizer),
                "max_length": b.max_length}
    b.inputs, b.cache_report = cached_inputs(b.model, b.inputs, identity, settings, name=b.task.name, log=log)


def feature_report(b: Built, train_seconds: float | None) -> dict:
    """For results.json: the layers and pooling the head read (learned scalar-mix weights too),
    the frozen cache, and encoder time against head-training time."""
    log(b.model.mixer.describe_mix())
    return {**b.model.mixer.report(), "pooling": getattr(b.model.head, "pooling", None),
            "cache": b.cache_report or {"status": "off"}, "encode_s": b.cache_report.get("encode_s"),
            "head_train_s": train_seconds}


def checkpoint_model_dir(path: str) -> str:
    for candidate in (path, os.path.join(path, "model")):
        if os.path.exists(os.path.join(candidate, "kotune.json")):
            return candidate
    raise KotuneError(f"checkpoint={path}: no saved model there (expected {path}/model/kotune.json)")


def trainer_class():
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class KotuneTrainer(Trainer):
        """Trainer whose evaluation keeps input order.

        transformers 5 reuses the *training* length-grouped sampler (random megabatches) for
        evaluation and prediction when ``train_sampling_strategy="group_by_length"``, which
        silently permutes predictions against their examples."""

        def _get_eval_sampler(self, eval_dataset):
            if eval_dataset is None or self.args.world_size > 1:
                return None  # distributed: accelerate shards sequentially and gathers in order
            return SequentialSampler(eval_dataset)

    return KotuneTrainer


def make_trainer(cfg: DictConfig, b: Built, run_dir: str):
    from tasks.collate import in_order, length_order, restore_order

    Trainer = trainer_class()
    task = b.task
    val = b.features.get("validation")
    train = b.features.get("train")
    do_eval = val is not None and train is not None and cfg.train.eval_strategy != "no"
    val_order = length_order(val) if do_eval else None  # sorted batches, as in predict()

    def compute_metrics(p) -> dict:
        predictions = restore_order(p.predictions, val_order)
        return task.score(task.decode(predictions, val, b.splits["validation"].examples),
                          b.splits["validation"].examples)

    return Trainer(
        model=b.model,
        args=training_arguments(cfg, run_dir, task, do_eval),
        train_dataset=b.inputs.get("train"),
        eval_dataset=in_order(b.inputs["validation"], val_order) if do_eval else None,
        data_collator=make_collator(b.tokenizer, cfg),
        compute_metrics=compute_metrics if do_eval else None,
    )


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


def write_predictions(run_dir: str, b: Built, split: str, outputs: list) -> str:
    """predictions.jsonl in input order, plus the task's own files (QA: predictions.json)."""
    path = os.path.join(run_dir, "predictions.jsonl")
    write_jsonl_atomic(path, b.task.prediction_records(outputs, b.splits[split].examples))
    b.task.write_outputs(run_dir, outputs, b.splits[split].examples)
    return path


# ---- actions -------------------------------------------------------------------------------
def action_train(cfg: DictConfig, run_dir: str) -> dict:
    with local_rank_zero_first():
        b = build(cfg, ("train", "validation"))
    trainer = make_trainer(cfg, b, run_dir)
    res = {"n_train": len(b.splits["train"].examples), "n_eval": len(b.splits["validation"].examples),
           **{k: v for k, v in b.model.param_counts().items()}, "max_length": b.max_length,
           "data": {s: d.source for s, d in b.splits.items()}}
    log(f"training: {res['n_train']} examples, {res['trainable_params']:,} trainable parameters")
    train_out = trainer.train()
    res["train_samples_per_second"] = train_out.metrics.get("train_samples_per_second")
    res["train_loss"] = train_out.metrics.get("train_loss")
    if not math.isfinite(res["train_loss"] if res["train_loss"] is not None else 0.0):
        raise KotuneError(f"training diverged: loss is {res['train_loss']}")
    res.update(feature_report(b, train_out.metrics.get("train_runtime")))
    log("evaluating")
    outputs, speed = predict(trainer, b, "validation")
    res.update(speed, metrics=b.task.score(outputs, b.splits["validation"].examples))
    if trainer.is_world_process_zero():
        if cfg.save_model:
            b.model.save(os.path.join(run_dir, "model"), b.tokenizer)
        if cfg.save_predictions:
            write_predictions(run_dir, b, "validation", outputs)
    return res


def predict_from_checkpoint(cfg: DictConfig, run_dir: str, split: str, usage: str) -> tuple[Built, list, dict]:
    """Reload ``checkpoint=`` and predict one split (action=eval and action=predict)."""
    if not cfg.get("checkpoint"):
        raise ConfigError(usage)
    with local_rank_zero_first():
        b = build(cfg, (split,))
    outputs, speed = predict(make_trainer(cfg, b, run_dir), b, split)
    return b, outputs, speed


def action_eval(cfg: DictConfig, run_dir: str) -> dict:
    b, outputs, speed = predict_from_checkpoint(
        cfg, run_dir, "validation", "action=eval needs checkpoint=RUN_DIR (a directory written by action=train)")
    if cfg.save_predictions:
        write_predictions(run_dir, b, "validation", outputs)
    return {"n_eval": len(outputs), **b.model.param_counts(), **speed, "checkpoint": cfg.checkpoint,
            **b.model.mixer.report(), "cache": b.cache_report or {"status": "off"},
            "metrics": b.task.score(outputs, b.splits["validation"].examples),
            "data": {s: d.source for s, d in b.splits.items()}}


def action_predict(cfg: DictConfig, run_dir: str) -> dict:
    b, outputs, speed = predict_from_checkpoint(
        cfg, run_dir, "predict", "action=predict needs checkpoint=RUN_DIR and data.predict_file=FILE")
    path = write_predictions(run_dir, b, "predict", outputs)
    log(f"wrote {len(outputs)} predictions to {path}")
    return {"n_predict": len(outputs), **speed, "checkpoint": cfg.checkpoint, "metrics": {},
            "predictions_file": path, "data": {s: d.source for s, d in b.splits.items()}}


def action_ceiling(cfg: DictConfig, run_dir: str) -> dict:
    """Gold labels through the exact encoding and decoding: the best score this tokenizer and
    these settings allow. Needs a tokenizer (and the model's config for its position limit),
    no weights."""
    from heads.encoder import build_config, load_tokenizer, uses_token_type_ids

    task = build_task(cfg.task)
    if not hasattr(task, "ceiling"):
        raise ConfigError(f"task {task.name} has no pipeline ceiling (it has no alignment to lose)")
    splits = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))
    examples = splits["validation"].examples
    tokenizer = load_tokenizer(cfg.model, texts=task.training_texts(examples), cache_dir=cfg.cache_dir)
    warn_unknown_hangul(tokenizer, task.training_texts(examples))
    config = build_config(cfg.model, len(tokenizer))
    settings = EncodeSettings(max_length=resolve_max_length(requested_max_length(cfg), config),
                              token_type_ids=uses_token_type_ids(config))
    features = encode_cached(task, examples, tokenizer, settings, cfg.cache_dir)
    metrics, report = task.ceiling(features, examples)
    for line in report.get("lines", []):
        log(line)
    return {"n_eval": len(examples), "max_length": settings.max_length, "metrics": metrics,
            "ceiling": {k: v for k, v in report.items() if k != "lines"},
            "data": {s: d.source for s, d in splits.items()}}


def action_embed(cfg: DictConfig, run_dir: str) -> dict:
    """Contextual embeddings of ``embed.input`` with ``mode.layers`` and ``mode.pooling``, from a
    checkpoint (its trained scalar mix when the layer choice matches) or the configured encoder;
    ``embed.target`` adds that word's vectors in context, layer by layer (tasks/embed.py)."""
    from heads.encoder import load_encoder, load_tokenizer, uses_token_type_ids
    from heads.feature_cache import pooled_vectors, token_vectors_by_layer
    from heads.layers import LayerMixer, check_pooling, parse_layers
    from tasks import embed

    if not cfg.embed.get("input"):
        raise ConfigError("action=embed needs embed.input=FILE (one text per line, or CSV/JSONL with embed.column)")
    rows = embed.read_texts(str(cfg.embed.input), str(cfg.embed.column), cfg.embed.get("format"), log=log)
    texts = [text for _, text in rows]
    pooling, head_pooling = check_pooling(cfg.mode.get("pooling")), None
    if cfg.get("checkpoint"):
        from transformers import AutoTokenizer

        from heads.model import KotuneModel

        source = checkpoint_model_dir(cfg.checkpoint)
        model = KotuneModel.load(source)
        tokenizer, encoder = AutoTokenizer.from_pretrained(source), model.encoder
        max_length, head_pooling = int(model.meta.get("max_length", cfg.train.max_length)), model.head_kwargs.get("pooling")
    else:
        source = cfg.model.name_or_path or cfg.model.name
        tokenizer = load_tokenizer(cfg.model, texts=texts, cache_dir=cfg.cache_dir)
        encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=int(cfg.train.seed))
        max_length = resolve_max_length(int(cfg.train.max_length), encoder.config)
    spec = parse_layers(cfg.mode.get("layers", "last"), int(encoder.config.num_hidden_layers))
    mixer = model.mixer if cfg.get("checkpoint") and model.mixer.spec == spec else LayerMixer(spec)
    pooling = pooling or head_pooling or "cls"
    features, offsets, truncated = embed.encode_texts(texts, tokenizer, max_length, uses_token_type_ids(encoder.config))
    if any(truncated):
        log(f"embed: {sum(truncated)} text(s) cut at {max_length} tokens (train.max_length)")
    log(f"embedding {len(texts)} texts: {mixer.describe_mix()}, {pooling} pooling")
    started = time.time()
    vectors = pooled_vectors(encoder, mixer, features, pooling, batch_size=int(cfg.train.eval_batch_size), log=log)
    lengths = [len(ids) for ids in features["input_ids"]]
    res = {"n_texts": len(texts), "dim": int(vectors.shape[1]), "encoder": str(source), **mixer.report(),
           "pooling": pooling, "max_length": max_length, "n_truncated": sum(truncated),
           "embed_s": round(time.time() - started, 3), "metrics": {},
           **embed.write_embeddings(run_dir, vectors, rows, str(cfg.embed.input), lengths, truncated)}
    log(f"wrote {vectors.shape[0]} × {vectors.shape[1]} embeddings to {res['embeddings_file']}")
    if cfg.embed.get("target"):
        target = str(cfg.embed.target)
        found = embed.find_target(target, texts, offsets, log=log)
        per_layer = token_vectors_by_layer(encoder, features, [(o.row, o.tokens) for o in found],
                                           batch_size=int(cfg.train.eval_batch_size), log=log)
        table = embed.cosine_by_layer(per_layer)
        for line in embed.cosine_lines(target, table):
            log(line)
        tokens = {o.row: tokenizer.convert_ids_to_tokens(features[o.row]["input_ids"]) for o in found}
        res["target"] = embed.write_target(run_dir, target, per_layer, found, texts, tokens, table)
    return res


def action_score(cfg: DictConfig, run_dir: str) -> dict:
    """Any system's predictions (``score.predictions``) against the gold ``data.validation_file``,
    with the task's own metrics (tasks/score.py reads and checks them)."""
    from tasks.score import align, read_predictions, to_outputs

    if not cfg.score.get("predictions"):
        raise ConfigError("action=score needs score.predictions=FILE and the gold file as data.validation_file=FILE")
    task = build_task(cfg.task)
    gold = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))["validation"]
    path = str(cfg.score.predictions)
    predicted = read_predictions(path, str(cfg.score.id_column), cfg.score.get("prediction_column"),
                                 cfg.score.get("format"))
    values = align(predicted, [str(ex["id"]) for ex in gold.examples], path, str(gold.source))
    outputs = to_outputs(task, values, gold.examples, path)
    return {"n_eval": len(outputs), "predictions_file": os.path.abspath(path),
            "metrics": task.score(outputs, gold.examples), "data": {"validation": gold.source}}


def action_export(cfg: DictConfig, run_dir: str) -> dict:
    """``checkpoint=`` as the native transformers class in ``export.dir`` (default: <run dir>/hf),
    or a one-line refusal for a head with no exact native equivalent (heads/export.py)."""
    from heads.export import export_directory

    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    out_dir = str(cfg.export.get("dir") or os.path.join(run_dir, "hf"))
    res = export_directory(checkpoint_model_dir(cfg.checkpoint), out_dir)
    use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
           f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
    log(f"exported {res['native_class']} to {out_dir}: {use}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}


ACTIONS: dict[str, Callable[[DictConfig, str], dict]] = {
    "train": action_train, "eval": action_eval, "predict": action_predict, "ceiling": action_ceiling,
    "embed": action_embed, "score": action_score, "export": action_export,
}


# ---- results -------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "datasets", "tokenizers", "hydra-core", "kotune"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def config_hash(cfg: DictConfig) -> str:
    """Identity of a job: the resolved config minus what does not change its result."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return fingerprint(plain)[:16]


def execute(cfg: DictConfig, run_dir: str) -> dict:
    """Run ``cfg.action`` and write ``run_dir/results.json``; returns the results dict."""
    started = time.time()
    os.makedirs(run_dir, exist_ok=True)
    results: dict[str, Any] = {
        "task": cfg.task.name, "model": cfg.model.name, "mode": cfg.mode.name, "action": cfg.action,
        "seed": int(cfg.train.seed), "status": "running", "main_metric": cfg.task.main_metric,
        "config_hash": config_hash(cfg), "run_dir": os.path.abspath(run_dir),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }
    try:
        if cfg.action not in ACTIONS:
            raise ConfigError(f"unknown action '{cfg.action}' (choices: {', '.join(ACTIONS)})")
        results.update(ACTIONS[cfg.action](cfg, run_dir))
        results["status"] = "ok"
    except KotuneError as e:
        results.update(status="failed", error=str(e), error_type=type(e).__name__)
    except Exception as e:  # noqa: BLE001 - a failed job still leaves a results file behind
        results.update(status="failed", error=f"{type(e).__name__}: {e}", error_type=type(e).__name__)
        if not cfg.get("keep_going_on_bugs", True):
            raise
        import traceback

        results["traceback"] = traceback.format_exc()
    results["runtime_s"] = round(time.time() - started, 3)
    metrics = results.get("metrics") or {}
    results["main_score"] = metrics.get(cfg.task.main_metric)
    results["config"] = OmegaConf.to_container(cfg, resolve=True)
    results["versions"] = versions()
    if int(os.environ.get("RANK", 0)) == 0:
        write_json_atomic(os.path.join(run_dir, "results.json"), results)
    return results


def summary(results: dict) -> str:
    rows = [("task", results["task"]), ("model", results["model"]), ("mode", results["mode"]),
            ("action", results["action"]), ("status", results["status"])]
    for k, v in (results.get("metrics") or {}).items():
        mark = " *" if k == results.get("main_metric") else ""
        rows.append((k + mark, f"{v:.2f}" if isinstance(v, float) else str(v)))
    for k in ("n_train", "n_eval", "trainable_params", "train_samples_per_second", "runtime_s"):
        if results.get(k) is not None:
            v = results[k]
            rows.append((k, f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def finished_results(path: str, cfg: DictConfig) -> dict | None:
    """An earlier ok results.json of this very config (resume of a multirun), else None: failed,
    partial or corrupt files and other configs mean the job runs (again)."""
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(done, dict) and done.get("status") == "ok" and done.get("config_hash") == config_hash(cfg):
        return done
    return None


def release_memory() -> None:
    """Between the jobs of a multirun: a failed job's (e.g. out-of-memory) model and optimizer
    sit in reference cycles; free them before the next job allocates its own."""
    gc.collect()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()


def sweep_id(argv: list[str]) -> str:
    """Default multirun directory name: a hash of the command's overrides (not hydra.* options or
    flags), so the same command run again finds its earlier jobs and resumes (conf/config.yaml)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")
                 and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    return "sweep-" + fingerprint(overrides)[:10]


def worst_score(cfg: DictConfig) -> float:
    return -1e9 if cfg.task.get("greater_is_better", True) else 1e9


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    quiet_libraries()
    path = os.path.join(hc.runtime.output_dir, "results.json")
    results = finished_results(path, cfg) if hc.mode == RunMode.MULTIRUN else None
    if results is not None:
        log(f"resume: {path} is complete for this config (hash {results['config_hash']}): skipped")
    else:
        results = execute(cfg, hc.runtime.output_dir)
        if hc.mode == RunMode.MULTIRUN:
            release_memory()
    if results["status"] == "ok":
        print(f"\n{summary(results)}\n  results: {path}", flush=True)
        score = results.get("main_score")
        return float(score) if score is not None and math.isfinite(score) else worst_score(cfg)
    print(f"error: {results['error']}", file=sys.stderr, flush=True)
    if hc.mode == RunMode.MULTIRUN:  # let the sweep go on; a sweeper gets a finite worst score
        return worst_score(cfg)
    sys.exit(1)


def quiet_libraries() -> None:
    import logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("transformers", "datasets", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import transformers

        transformers.logging.set_verbosity_warning()
    except ImportError:
        pass


def check_choices(argv: list[str]) -> None:
    """Unknown task/model/mode on the command line: one line listing the choices."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        choices = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, key)) if f.endswith(".yaml"))
        for v in value.split(","):
            if v and v not in choices and not v.startswith(("choice(", "range(", "glob(")):
                print(f"error: unknown {key} '{v}' (choices: {', '.join(choices)})", file=sys.stderr)
                sys.exit(2)


OPEN_DICTS = ("model.config_overrides.", "model.tokenizer_kwargs.")


def open_dict_overrides(argv: list[str]) -> list[str]:
    """``model.config_overrides.X=V`` works without Hydra's ``+``/``++``: these dicts are open by
    design (any field of the architecture's config), so the override is made add-or-replace."""
    return [f"++{a}" if a.startswith(OPEN_DICTS) else a for a in argv]


def quote_non_ascii(argv: list[str]) -> list[str]:
    """Hydra's override grammar rejects unquoted non-ASCII values (``embed.target=은행``, a path
    with Hangul): quote plain ones; lists, sweeps and already quoted values stay as typed."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("-") and not value.isascii() and not any(c in value for c in "'\"[]{}(),"):
            arg = f"{key}='{value}'"
        out.append(arg)
    return out


def shared_run_dir(argv: list[str]) -> list[str]:
    """Under torchrun every process composes its own config: the default run directory's
    timestamp could differ between them (rank 0's results and model in one directory, another
    rank's checkpoint files in another). Without an explicit ``hydra.run.dir`` the processes of
    one launch share ``<date>_torchrun-<launcher pid>`` instead."""
    explicit = any(a.lstrip("+").startswith("hydra.run.dir=") for a in argv)
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or explicit:
        return argv
    return argv + ["hydra.run.dir=outputs/${task.name}/${model.name}/${mode.name}/"
                   f"${{now:%Y-%m-%d}}_torchrun-{os.getppid()}"]


if __name__ == "__main__":
    check_choices(sys.argv[1:])
    os.environ.setdefault("KOTUNE_SWEEP_ID", sweep_id(sys.argv[1:]))
    sys.argv[1:] = shared_run_dir(quote_non_ascii(open_dict_overrides(sys.argv[1:])))
    # Idle OpenMP threads sleep rather than spin (read when torch loads, so set before). On a CPU
    # shared with other jobs, or by torchrun processes, spinning threads that lose their core
    # stall every op: measured 2.6x slower BERT-base steps on a busy 2-core machine, a few % the
    # other way on an idle one. An explicit OMP_WAIT_POLICY wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
