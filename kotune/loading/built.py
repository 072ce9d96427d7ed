"""What every job's loading ends in, whether fresh (kotune/loading/build.py) or from a checkpoint
(kotune/loading/from_checkpoint.py): the encoder side (:class:`Encoder`), the length a job reads
with, and :func:`encode_splits`, which encodes the splits for the model into a :class:`Built`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from kotune.devices import pad_multiple
from tasks.base import EncodeSettings, Task
from tasks.encode_cache import encode_cached, tokenizer_fingerprint
from tasks.splits import Split
from kotune.core.errors import ConfigError
from kotune.core.log import log

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


class Built:
    """Everything one run needs: task, splits, tokenizer, model, features."""

    def __init__(self, task: Task, splits: dict[str, Split], tokenizer, model, features: dict, max_length: int):
        self.task, self.splits, self.tokenizer, self.model = task, splits, tokenizer, model
        self.features, self.max_length = features, max_length
        self.class_weights: dict | None = None  # train.class_weights: {label: {count, weight}} (kotune/training/weighting.py)
        # what Trainer reads per split: the model columns, or with them cached frozen states
        self.inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
        self.cache_report: dict = {}
        self.min_confidence: float | None = None  # predict.min_confidence, checked (tasks/abstention.py); None: off
        self.settings: EncodeSettings | None = None  # set by encode_splits: how new text is encoded (action=serve)
        self.tokenizer_key: str | None = None  # the tokenizer's fingerprint (tasks/encode_cache.py), set by encode_splits


def encode_splits(task: Task, splits: dict[str, Split], model, tokenizer, settings: EncodeSettings,
                  cache_dir: str | None, padding_free: bool = False) -> Built:
    """The splits encoded for ``model`` (cached by content in ``cache_dir``: tasks/encode_cache.py),
    as one :class:`Built`; the caller adds class weights and, in frozen mode, the feature cache.
    ``padding_free``: ``model.padding_free``, how the model runs its encoder (refused before any encoding)."""
    model.windows = task.windows  # the task's windowing, read by the model's pooling (heads/model/windows.py)
    use_padding_free(model, padding_free)
    features, tokenizer_key = {}, tokenizer_fingerprint(tokenizer)
    for split, data in splits.items():
        log(f"encoding {split}: {len(data.examples)} examples")
        features[split] = encode_cached(task, data.examples, tokenizer, settings, cache_dir, tokenizer_key)
    built = Built(task, splits, tokenizer, model, features, settings.max_length)
    built.settings, built.tokenizer_key = settings, tokenizer_key
    return built


def use_padding_free(model, on: bool) -> None:
    """``model.padding_free`` for a kotune model (heads/model/packing.py); an export's own runtime
    (ONNX, a native class) runs its graph as exported, and is refused in one line."""
    if not on:
        return
    if not hasattr(model, "set_padding_free"):
        raise ConfigError(f"model.padding_free=true: a {getattr(model, 'runtime', 'exported')} model runs its graph "
                          "as exported, padded; read the kotune checkpoint instead, or set model.padding_free=false")
    model.set_padding_free(True)


def frozen_cache_settings(cfg: DictConfig):
    """``mode.cache``'s settings (heads/model/feature_cache.py's ``CacheSettings``), None when off."""
    if not cfg.mode.get("cache"):
        return None
    from heads.model.feature_cache import CacheSettings

    if not cfg.get("cache_dir"):
        raise ConfigError("mode.cache=true needs cache_dir=DIR (where frozen features are stored)")
    return CacheSettings(str(cfg.cache_dir), str(cfg.mode.get("cache_dtype", "float16")),
                         float(cfg.mode.get("cache_max_gb", 20)), int(cfg.train.eval_batch_size))


def use_frozen_cache(b: Built, settings) -> None:
    """``mode.cache``: encode each split once with the frozen encoder; Trainer then reads the
    stored states (heads/model/feature_cache.py)."""
    from heads.model.feature_cache import cached_inputs

    if b.task.windows is not None:
        raise ConfigError("task.long_text=windows: a document is several windows, and the frozen feature cache "
                          "(mode.cache, which action=probe reads) stores one sequence per row; set mode.cache=false")
    identity = {"model": b.model.meta.get("model"), "tokenizer": b.tokenizer_key,
                "max_length": b.max_length}
    b.inputs, b.cache_report = cached_inputs(b.model, b.inputs, identity, settings, name=b.task.name)
