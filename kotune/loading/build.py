"""One loader for every action: the task (with a checkpoint's saved options), its splits, the
tokenizer and encoder (fresh from ``cfg.model`` or everything from ``checkpoint=``), the model,
the encoded features and, in frozen mode, the feature cache."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from kotune.loading.checkpoint import checkpoint_model_dir, read_spec
from kotune.loading.reconcile import check_checkpoint_mode, task_for_checkpoint, use_saved_columns
from kotune.devices import pad_multiple, seed_everything
from kotune.inference.model_runtimes import runtime_of
from kotune.training.weighting import apply_class_weights, check_class_weights
from tasks import build_task
from tasks.base import EncodeSettings, Task
from tasks.encode_cache import encode_cached
from tasks.label_typos import warn_rare_labels
from tasks.splits import Split, load_splits, require_data_files
from kotune.core.errors import ConfigError
from kotune.core.log import log, warn

UNK_WARN_RATE = 0.05


def requested_max_length(cfg: DictConfig) -> int:
    """``task.max_length`` where the task sets one (QA windows: 384), else ``train.max_length``."""
    return int(cfg.task.get("max_length") or cfg.train.max_length)


def resolve_max_length(requested: int, encoder_config) -> int:
    from heads.model.encoder import position_limit

    limit = position_limit(encoder_config)
    if requested > limit:
        log(f"max_length={requested} exceeds the model's {limit} positions: using {limit}")
        return limit
    return requested


def warn_unknown_hangul(tokenizer, texts) -> float:
    from heads.model.encoder import unk_rate

    rate = unk_rate(tokenizer, texts)
    if rate > UNK_WARN_RATE:
        log(f"WARNING: the tokenizer maps {rate:.0%} of Hangul syllables to [UNK]. A cased Korean "
            "vocabulary loaded with lowercasing/accent stripping decomposes Hangul into jamo: set "
            "model.tokenizer_kwargs.do_lower_case=false")
    return rate


def make_collator(tokenizer, cfg: DictConfig):
    from tasks.collate import DynamicPaddingCollator

    return DynamicPaddingCollator(tokenizer.pad_token_id, pad_multiple(cfg.train))


@dataclass
class Encoder:
    """What an action needs to encode text for a model: the tokenizer, the encoder's config and
    length, and either a trained model (``checkpoint=``) or a fresh encoder (or neither: weights
    not needed, as for the ceiling)."""

    tokenizer: Any
    config: Any
    max_length: int
    token_type_ids: bool
    model: Any = None      # KotuneModel from a checkpoint
    encoder: Any = None    # a fresh encoder (pretrained or random) from cfg.model
    base: Any = None       # mode=lora: what rebuilds the fresh encoder as built (heads.model.lora.base_record)


def load_encoder_side(cfg: DictConfig, task: Task | None, texts: Iterable[str] | None,
                      weights: bool = True, onnx: bool = False) -> Encoder:
    """Tokenizer + encoder from ``checkpoint=`` (everything as saved) or from ``cfg.model``."""
    from heads.model.encoder import add_special_tokens, build_config, load_encoder, load_tokenizer, uses_token_type_ids

    if cfg.get("checkpoint"):
        return load_checkpoint_side(cfg, task, onnx)
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
                               head_kind=task.head if task is not None else None)
    base = None
    if encoder is not None and cfg.mode.get("lora"):  # recorded before a task's tokens grow the embeddings
        from heads.model.lora import base_record

        base = base_record(OmegaConf.to_container(cfg.model, resolve=True), encoder, int(cfg.train.seed))
    added = add_special_tokens(tokenizer, encoder, task.special_tokens if task is not None else ())  # RE's <subj>
    if added and cfg.mode.frozen:  # their new embedding rows are random, and a frozen encoder never trains them
        warn(f"mode=frozen: the {added} token(s) task {task.name} adds ({', '.join(task.special_tokens)}) "
            "keep random embeddings (the encoder does not train); a frozen encoder reads marked entities best "
            "with tokens it knows (RE: task.markers=typed_punct)")
    config = encoder.config if encoder is not None else build_config(cfg.model, len(tokenizer))
    return Encoder(tokenizer, config, resolve_max_length(requested_max_length(cfg), config),
                   uses_token_type_ids(config), encoder=encoder, base=base)


def load_checkpoint_side(cfg: DictConfig, task: Task | None, onnx: bool = False) -> Encoder:
    """Everything as saved in ``checkpoint=``: a kotune checkpoint or, where the action only
    predicts (``onnx``), an ONNX export run by onnxruntime (kotune/export/onnx.py)."""
    from transformers import AutoConfig, AutoTokenizer

    from heads.model.encoder import position_limit, uses_token_type_ids
    from kotune.export.onnx import is_onnx_export

    path = str(cfg.checkpoint)
    if onnx and is_onnx_export(path):
        from heads.model.artifact import check_length
        from kotune.export.onnx import EXPORT_FILE, OnnxModel

        runtime = cfg.get("onnx") or {}
        model_dir, model = path, OnnxModel(path, runtime.get("file"), runtime.get("threads"))
        config = AutoConfig.from_pretrained(path)
        # its length within its encoder's positions (a checkpoint's is checked as it loads: KotuneModel.load)
        check_length(model.meta.get("max_length"), position_limit(config), f"{path}/{EXPORT_FILE}", "config.json")
    else:
        from heads.model.kotune_model import KotuneModel

        model_dir = checkpoint_model_dir(path)
        model = KotuneModel.load(model_dir)
        config = model.encoder.config
    requested = min(requested_max_length(cfg), position_limit(config))
    if task is not None and model.meta.get("max_length") and requested != model.meta["max_length"]:
        log(f"warning: checkpoint {path} was trained with max_length={model.meta['max_length']}: reading with "
            f"it, not the max_length={requested} asked for")
    return Encoder(AutoTokenizer.from_pretrained(model_dir), config,
                   int(model.meta.get("max_length", requested_max_length(cfg))),
                   bool(model.meta.get("token_type_ids", uses_token_type_ids(config))),
                   model=model, encoder=getattr(model, "encoder", None))


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


class Built:
    """Everything one run needs: task, splits, tokenizer, model, features."""

    def __init__(self, task: Task, splits: dict[str, Split], tokenizer, model, features: dict, max_length: int):
        self.task, self.splits, self.tokenizer, self.model = task, splits, tokenizer, model
        self.features, self.max_length = features, max_length
        self.class_weights: dict | None = None  # train.class_weights: {label: {count, weight}} (kotune/training/weighting.py)
        # what Trainer reads per split: the model columns, or with them cached frozen states
        self.inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
        self.cache_report: dict = {}
        self.settings: EncodeSettings | None = None  # set by build(): how new text is encoded (action=serve)


def build(cfg: DictConfig, need: tuple[str, ...], new_head: bool = False, onnx: bool = False,
          encoder_side: Callable[[Task, list], Encoder] | None = None) -> Built:
    """Task, splits, encoder side (fresh or ``checkpoint=``), the model and encoded features.
    ``new_head``: a checkpoint gives only its tokenizer and encoder; the head and the labels are
    new, from ``cfg`` and the train split (``action=probe``). ``onnx``: ``checkpoint=`` may be an
    ONNX export (actions that only predict). ``encoder_side``: (task, training texts) → the
    tokenizer and a fresh encoder, in place of ``cfg.model``'s (action=distill's student)."""
    task = build_task(cfg.task)
    from kotune.calibration.abstention import min_confidence

    min_confidence(cfg, task)  # predict.min_confidence on a task that cannot abstain: refused before any work
    if cfg.get("checkpoint") and not new_head:
        # a checkpoint or data file that is not there: one line before torch and the model load
        from kotune.export.onnx import is_onnx_export

        if not (onnx and is_onnx_export(str(cfg.checkpoint))):
            checkpoint_model_dir(str(cfg.checkpoint))
        require_data_files(cfg.data, need)
        seed_everything(int(cfg.train.seed))
        loaded = load_encoder_side(cfg, task, None, onnx=onnx)
        if runtime_of(loaded.model).kotune_model:  # an export is a plain native model (kotune/inference/model_runtimes.py)
            check_checkpoint_mode(cfg, loaded.model, cfg.checkpoint, "train" in need)
        task = task_for_checkpoint(task, loaded.model.meta | {"head": loaded.model.head_description()}, cfg.checkpoint)
        use_saved_columns(task, loaded.model.meta, cfg.checkpoint)
        splits = load_splits(task, cfg.data, need, int(cfg.train.seed), calibrate_fraction(cfg, need))
        model = loaded.model
    else:
        if cfg.get("checkpoint"):  # action=probe: a new head on the checkpoint's encoder
            use_saved_columns(task, read_spec(cfg.checkpoint).get("meta") or {}, cfg.checkpoint)
        splits = load_splits(task, cfg.data, need, int(cfg.train.seed), calibrate_fraction(cfg, need))
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
    model.windows = task.windows  # the task's windowing, read by the model's pooling (heads/model/windows.py)
    fresh_head = not cfg.get("checkpoint") or new_head
    check_class_weights(cfg, model, task.name, fresh_head)
    settings = EncodeSettings(max_length=loaded.max_length, token_type_ids=loaded.token_type_ids)
    features = {}
    for split, data in splits.items():
        log(f"encoding {split}: {len(data.examples)} examples")
        features[split] = encode_cached(task, data.examples, loaded.tokenizer, settings, cfg.cache_dir)
    built = Built(task, splits, loaded.tokenizer, model, features, loaded.max_length)
    built.settings = settings
    built.class_weights = apply_class_weights(cfg, model, task.labels, features.get("train"), fresh_head)
    if cfg.mode.get("cache") and (model.frozen or not cfg.get("checkpoint") or new_head):
        use_frozen_cache(cfg, built)
    return built


def calibrate_fraction(cfg: DictConfig, need: tuple[str, ...]) -> float:
    """``train.calibrate`` (kotune/calibration/fit.py): the share of the training split held out to fit it
    on, where the action asks for it (action=train: 'calibrate' in ``need``); else 0."""
    if "calibrate" not in need:
        return 0.0
    from kotune.calibration.fit import fraction

    return fraction(cfg)


def plugin_record(task) -> dict:
    """``{"plugin": module}`` for a task a plug-in registered (what a checkpoint needs loaded to be read
    back: kotune/plugins.py); nothing for kotune's own, whose checkpoints stay as they were."""
    module = type(task).__module__
    return {} if module.split(".")[0] == "tasks" else {"plugin": module}


def use_frozen_cache(cfg: DictConfig, b: Built) -> None:
    """``mode.cache``: encode each split once with the frozen encoder; Trainer then reads the
    stored states (heads/model/feature_cache.py)."""
    from heads.model.feature_cache import CacheSettings, cached_inputs
    from tasks.encode_cache import tokenizer_fingerprint

    if not cfg.get("cache_dir"):
        raise ConfigError("mode.cache=true needs cache_dir=DIR (where frozen features are stored)")
    if b.task.windows is not None:
        raise ConfigError("task.long_text=windows: a document is several windows, and the frozen feature cache "
                          "(mode.cache, which action=probe reads) stores one sequence per row; set mode.cache=false")
    settings = CacheSettings(str(cfg.cache_dir), str(cfg.mode.get("cache_dtype", "float16")),
                             float(cfg.mode.get("cache_max_gb", 20)), int(cfg.train.eval_batch_size))
    identity = {"model": b.model.meta.get("model"), "tokenizer": tokenizer_fingerprint(b.tokenizer),
                "max_length": b.max_length}
    b.inputs, b.cache_report = cached_inputs(b.model, b.inputs, identity, settings, name=b.task.name)
