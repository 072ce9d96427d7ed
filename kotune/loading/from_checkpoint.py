"""A job from ``checkpoint=``, in three steps: the checkpoint read once into its record
(kotune/loading/checkpoint.py), reconciled with the job's config in one function
(kotune/loading/reconcile.py), then built: the data read as the checkpoint's task reads it and
encoded for its model (kotune/loading/built.py). action=predict, eval and serve, ``kotune.load``'s
embeddings and a checkpoint's continued training take this path; a fresh model takes
kotune/loading/build.py's."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.devices import seed_everything
from kotune.loading.built import Built, Encoder, encode_splits, use_frozen_cache
from kotune.loading.checkpoint import Checkpoint, checkpoint_model_dir, read_checkpoint
from kotune.loading.reconcile import Reading, checkpoint_length, reconcile
from tasks import build_task
from tasks.abstention import checked_threshold
from tasks.splits import load_splits, require_data_files


def build_from_checkpoint(cfg: DictConfig, need: tuple[str, ...], onnx: bool = False,
                          calibrate_share: float = 0.0) -> Built:
    """The job's task, splits, model and features from ``checkpoint=``. ``onnx``: an ONNX export may
    stand in (actions that only predict). ``calibrate_share``: the share of the training split held
    out for ``train.calibrate`` (a checkpoint's continued training)."""
    task = build_task(cfg.task)
    # mistakes in the options, the checkpoint's path or the data: one line before torch and the model load
    threshold = checked_threshold((cfg.get("predict") or {}).get("min_confidence"), task)
    path = str(cfg.checkpoint)
    if not (onnx and is_export(path)):
        checkpoint_model_dir(path)
    require_data_files(cfg.data, need)
    seed_everything(int(cfg.train.seed))
    checkpoint = read_checkpoint(path, onnx_settings(cfg) if onnx else None)
    built = built_from(checkpoint, reconcile(cfg, checkpoint, task, need, calibrate_share))
    built.min_confidence = threshold
    return built


def built_from(checkpoint: Checkpoint, reading: Reading) -> Built:
    """The job built from its checkpoint as reconciled: the splits read as the checkpoint's task
    reads them, encoded for its model; the class weights it was trained with; in frozen mode, the
    feature cache."""
    splits = load_splits(reading.task, reading.data, reading.need, reading.seed, reading.calibrate_share)
    built = encode_splits(reading.task, splits, checkpoint.model, checkpoint.tokenizer, reading.settings,
                          reading.cache_dir, reading.padding_free)
    built.class_weights = reading.class_weights
    if reading.frozen_cache is not None:
        use_frozen_cache(built, reading.frozen_cache)
    return built


def checkpoint_side(cfg: DictConfig, onnx: bool = False, warn: bool = False) -> Encoder:
    """The encoder side of ``checkpoint=`` alone (a distillation teacher, embeddings, the frozen
    encoder a probe reads): its record as an :class:`Encoder`, read with the length it was trained
    with (``warn``: say so when the job asked for another)."""
    return encoder_of(cfg, read_checkpoint(str(cfg.checkpoint), onnx_settings(cfg) if onnx else None), warn)


def encoder_of(cfg: DictConfig, checkpoint: Checkpoint, warn: bool = False) -> Encoder:
    """A read checkpoint as an :class:`Encoder` (its tokenizer, config, length, token types, model)."""
    return Encoder(checkpoint.tokenizer, checkpoint.config, checkpoint_length(cfg, checkpoint, warn),
                   checkpoint.token_type_ids, model=checkpoint.model, encoder=getattr(checkpoint.model, "encoder", None))


def onnx_settings(cfg: DictConfig) -> dict:
    """The job's ``onnx`` settings (``onnx.file``, ``onnx.threads``) for an export that stands in."""
    return dict(cfg.get("onnx") or {})


def is_export(path: str) -> bool:
    from kotune.export.onnx import is_onnx_export

    return is_onnx_export(path)
