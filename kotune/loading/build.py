"""A job's loading: :func:`build` gives every action its task, splits, model and encoded features.
From ``checkpoint=`` it is kotune/loading/from_checkpoint.py's (the checkpoint read once, reconciled,
built); a fresh model is built here: the task's labels fitted on the training data, the tokenizer
and encoder from ``cfg.model`` (or a caller's, as distillation's student), a new head."""
from __future__ import annotations

from typing import Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from kotune.devices import pad_multiple, seed_everything
from kotune.loading.built import Built, Encoder, encode_splits, resolve_max_length, use_frozen_cache, warn_unknown_hangul
from kotune.loading.checkpoint import read_spec
from kotune.loading.from_checkpoint import build_from_checkpoint, checkpoint_side
from kotune.loading.reconcile import frozen_cache_settings, requested_max_length, use_saved_columns
from kotune.training.weighting import apply_class_weights, check_class_weights
from tasks import build_task
from tasks.abstention import checked_threshold
from tasks.base import EncodeSettings, Task
from tasks.label_typos import warn_rare_labels
from tasks.splits import load_splits
from kotune.core.log import log, warn


def load_encoder_side(cfg: DictConfig, task: Task | None, texts: Iterable[str] | None,
                      weights: bool = True, onnx: bool = False) -> Encoder:
    """Tokenizer + encoder from ``checkpoint=`` (everything as saved) or from ``cfg.model``."""
    from heads.model.encoder import add_special_tokens, build_config, load_encoder, load_tokenizer, uses_token_type_ids

    if cfg.get("checkpoint"):
        return checkpoint_side(cfg, onnx, warn=task is not None)
    log("loading tokenizer")
    texts = list(texts) if texts is not None else None
    tokenizer = load_tokenizer(cfg.model, texts=texts, cache_dir=cfg.cache_dir)
    if texts:
        warn_unknown_hangul(tokenizer, texts)
    encoder = None
    if weights:
        log(f"building encoder ({cfg.model.init}: {cfg.model.name_or_path or cfg.model.name})")
        # a sequence head starts from a pretrained BERT's pooler (heads/native.py): keep it for them
        encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=int(cfg.train.seed),
                               head_kind=task.head if task is not None else None, pad_token_id=tokenizer.pad_token_id)
    base = None
    if encoder is not None and cfg.mode.get("lora"):  # recorded before a task's tokens grow the embeddings
        from heads.model.lora import base_record

        base = base_record(OmegaConf.to_container(cfg.model, resolve=True), encoder, int(cfg.train.seed))
    added = add_special_tokens(tokenizer, encoder, task.special_tokens if task is not None else ())  # RE's <subj>
    if added and cfg.mode.frozen:  # their new embedding rows are random, and a frozen encoder never trains them
        warn(f"mode=frozen: the {added} token(s) task {task.name} adds ({', '.join(task.special_tokens)}) "
            "keep random embeddings (the encoder does not train); a frozen encoder reads marked entities best "
            "with tokens it knows (RE: task.markers=typed_punct)")
    config = encoder.config if encoder is not None else build_config(cfg.model, len(tokenizer), tokenizer.pad_token_id)
    return Encoder(tokenizer, config, resolve_max_length(requested_max_length(cfg), config),
                   uses_token_type_ids(config), encoder=encoder, base=base)


def lora_settings(cfg: DictConfig, loaded: Encoder) -> dict | None:
    """``mode=lora``'s adapter settings for a fresh encoder (heads/model/lora.py), or None in other modes."""
    if not cfg.mode.get("lora"):
        return None
    from heads.model.lora import new_token_rows

    m = cfg.mode
    targets = m.get("target_modules")
    return {"r": int(m.r), "alpha": float(m.alpha), "dropout": float(m.dropout),
            "target_modules": OmegaConf.to_container(targets) if OmegaConf.is_config(targets) else targets,
            "base": loaded.base, "token_rows": new_token_rows(loaded.encoder, loaded.base["vocab_size"])}


def build(cfg: DictConfig, need: tuple[str, ...], new_head: bool = False, onnx: bool = False,
          encoder_side: Callable[[Task, list], Encoder] | None = None, calibrate_share: float = 0.0) -> Built:
    """Task, splits, encoder side (fresh or ``checkpoint=``), the model and encoded features.
    ``new_head``: a checkpoint gives only its tokenizer and encoder; the head and the labels are
    new, from ``cfg`` and the train split (``action=probe``). ``onnx``: ``checkpoint=`` may be an
    ONNX export (actions that only predict). ``encoder_side``: (task, training texts) → the
    tokenizer and a fresh encoder, in place of ``cfg.model``'s (action=distill's student).
    ``calibrate_share``: the share of the training split held out for ``train.calibrate``."""
    if cfg.get("checkpoint") and not new_head:
        return build_from_checkpoint(cfg, need, onnx, calibrate_share)
    task = build_task(cfg.task)
    threshold = checked_threshold((cfg.get("predict") or {}).get("min_confidence"), task)  # refused before any work
    if cfg.get("checkpoint"):  # action=probe: a new head on the checkpoint's encoder
        use_saved_columns(task, read_spec(cfg.checkpoint).get("meta") or {}, cfg.checkpoint)
    splits = load_splits(task, cfg.data, need, int(cfg.train.seed), calibrate_share)
    if "train" in splits:  # the training data, with any slice held out to tune a decision on
        training = [ex for s in ("train", "tune", "calibrate") if s in splits for ex in splits[s].examples]
        if task.labels is None:  # a label set learned from the file: a far rarer label is likely a typo
            warn_rare_labels(task, training, splits["train"].where)
        task.fit_labels(training)
        if "validation" in splits:
            task.check_labels(splits["validation"].examples, splits["validation"].where)
    # seeded (torch, transformers) once the data is read, on seeds of its own: a mistake there answers first
    seed_everything(int(cfg.train.seed))
    from heads.model.kotune_model import KotuneModel

    first = splits.get("train") or next(iter(splits.values()))
    texts = task.training_texts(first.examples)
    loaded = encoder_side(task, texts) if encoder_side is not None else load_encoder_side(cfg, task, texts)
    head_kwargs = dict(task.head_kwargs(), dropout=cfg.train.get("head_dropout"))  # None: the architecture's
    if cfg.mode.get("setfit"):  # SetFit's differentiable head: one linear layer on the embedding
        head_kwargs["architecture"] = "linear"
    meta = {"task": task.name, "labels": task.labels, "max_length": loaded.max_length,
            "token_type_ids": loaded.token_type_ids, "model": cfg.model.name,
            "task_options": {k: task.cfg.get(k) for k in task.saved_options},
            "columns": OmegaConf.to_container(task.cfg.columns) if task.cfg.get("columns") else None,
            **plugin_record(task)}
    # a checkpoint lends its encoder alone (action=probe): a LoRA adapter merged into its base
    encoder = loaded.model.bare_encoder() if loaded.model is not None else loaded.encoder
    model = KotuneModel(encoder, task.head, head_kwargs, frozen=bool(cfg.mode.frozen), meta=meta,
                        layers=cfg.mode.get("layers", "last"), pooling=cfg.mode.get("pooling"),
                        lora=lora_settings(cfg, loaded))
    check_class_weights(cfg, model, task.name, fresh_head=True)  # before anything is encoded
    settings = EncodeSettings(max_length=loaded.max_length, token_type_ids=loaded.token_type_ids)
    built = encode_splits(task, splits, model, loaded.tokenizer, settings, cfg.cache_dir,
                          bool(cfg.model.get("padding_free")), pad_multiple(cfg.train))
    built.class_weights = apply_class_weights(cfg, model, task.labels, built.features.get("train"), fresh_head=True)
    built.min_confidence = threshold
    cache = frozen_cache_settings(cfg)
    if cache is not None:
        use_frozen_cache(built, cache)
    return built


def plugin_record(task) -> dict:
    """``{"plugin": module}`` for a task a plug-in registered (what a checkpoint needs loaded to be read
    back: kotune/plugins.py); nothing for kotune's own, whose checkpoints stay as they were."""
    module = type(task).__module__
    return {} if module.split(".")[0] == "tasks" else {"plugin": module}
