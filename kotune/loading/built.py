"""What every job's loading ends in, whether fresh (kotune/loading/build.py) or from a checkpoint
(kotune/loading/from_checkpoint.py): the encoder side (:class:`Encoder`), the length a job reads
with, :func:`encode_splits`, which encodes the splits for the model into a :class:`Built` (with the
collator its batches are padded by), and :func:`built_from`, which builds a checkpoint's model as
the job reads it (:class:`Reading`, from kotune/loading/reconcile.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from tasks.base import EncodeSettings, Task
from tasks.encode_cache import encode_cached, tokenizer_fingerprint
from tasks.splits import Split, load_splits
from kotune.core.errors import ConfigError
from kotune.core.log import log

UNK_WARN_RATE = 0.05


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


def make_collator(tokenizer, multiple: int):
    """The training collator: rows padded with the tokenizer's pad id to their longest, rounded up to
    ``multiple`` (``train.pad_to_multiple_of``: kotune/devices.py's ``pad_multiple``)."""
    from tasks.collate import DynamicPaddingCollator

    return DynamicPaddingCollator(tokenizer.pad_token_id, multiple)


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


@dataclass(frozen=True)
class Reading:
    """How the job reads the checkpoint, all that the build takes from the job's config: its task
    (with the checkpoint's options and columns), the encoding its model was trained with, the data
    to read (``data``, the splits ``need``ed, ``seed``, the share held out for ``train.calibrate``),
    the encoded-feature cache, the class weights the checkpoint keeps (``train.class_weights``
    applies to training), the frozen-feature cache's settings (None: off), ``model.padding_free``
    (how the encoder runs, the job's choice whatever the checkpoint was trained with) and the
    multiple batches are padded to (``train.pad_to_multiple_of``, this machine's)."""

    task: Task
    settings: EncodeSettings
    data: DictConfig
    need: tuple[str, ...]
    seed: int
    calibrate_share: float
    cache_dir: str | None
    class_weights: dict | None
    frozen_cache: Any = None
    padding_free: bool = False
    pad_to: int = 1


class Built:
    """Everything one run needs: task, splits, tokenizer, model, features."""

    def __init__(self, task: Task, splits: dict[str, Split], tokenizer, model, features: dict, max_length: int,
                 collator):
        self.task, self.splits, self.tokenizer, self.model = task, splits, tokenizer, model
        self.features, self.max_length = features, max_length
        self.collator = collator  # batches padded alike wherever they run: Trainer, a BatchPredictor, the server
        self.class_weights: dict | None = None  # train.class_weights: {label: {count, weight}} (kotune/training/weighting.py)
        # what Trainer reads per split: the model columns, or with them cached frozen states
        self.inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
        self.cache_report: dict = {}
        self.min_confidence: float | None = None  # predict.min_confidence, checked (tasks/abstention.py); None: off
        self.settings: EncodeSettings | None = None  # set by encode_splits: how new text is encoded (action=serve)
        self.tokenizer_key: str | None = None  # the tokenizer's fingerprint (tasks/encode_cache.py), set by encode_splits


def encode_splits(task: Task, splits: dict[str, Split], model, tokenizer, settings: EncodeSettings,
                  cache_dir: str | None, padding_free: bool = False, pad_to: int = 1) -> Built:
    """The splits encoded for ``model`` (cached by content in ``cache_dir``: tasks/encode_cache.py),
    as one :class:`Built`, with the collator its batches are padded by (to a multiple of ``pad_to``);
    the caller adds class weights and, in frozen mode, the feature cache.
    ``padding_free``: ``model.padding_free``, how the model runs its encoder (refused before any encoding)."""
    model.windows = task.windows  # the task's windowing, read by the model's pooling (heads/model/windows.py)
    use_padding_free(model, padding_free)
    collator = make_collator(tokenizer, pad_to)
    features, tokenizer_key = {}, tokenizer_fingerprint(tokenizer)
    for split, data in splits.items():
        log(f"encoding {split}: {len(data.examples)} examples")
        features[split] = encode_cached(task, data.examples, tokenizer, settings, cache_dir, tokenizer_key)
    built = Built(task, splits, tokenizer, model, features, settings.max_length, collator)
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


def built_from(reading: Reading, model, tokenizer) -> Built:
    """A checkpoint's ``model`` and ``tokenizer`` built as the job reads them (``reading``:
    kotune/loading/reconcile.py): the splits read as the checkpoint's task reads them, encoded for
    its model; the class weights it was trained with; in frozen mode, the feature cache."""
    splits = load_splits(reading.task, reading.data, reading.need, reading.seed, reading.calibrate_share)
    built = encode_splits(reading.task, splits, model, tokenizer, reading.settings,
                          reading.cache_dir, reading.padding_free, reading.pad_to)
    built.class_weights = reading.class_weights
    if reading.frozen_cache is not None:
        use_frozen_cache(built, reading.frozen_cache)
    return built
