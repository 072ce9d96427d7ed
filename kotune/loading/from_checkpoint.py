"""A job from ``checkpoint=``, in three steps: the checkpoint read once into its record
(kotune/loading/checkpoint.py), reconciled with the job's config in one function
(kotune/loading/reconcile.py), then built: the data read as the checkpoint's task reads it and
encoded for its model (kotune/loading/built.py). action=predict, eval and serve, ``kotune.load``'s
embeddings and a checkpoint's continued training take this path; a fresh model takes
kotune/loading/build.py's."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.loading.built import Built, Encoder, built_from
from kotune.loading.checkpoint import Checkpoint, checkpoint_model_dir, read_checkpoint
from kotune.loading.reconcile import checkpoint_length, reconcile
from tasks import build_task
from tasks.abstention import checked_threshold
from tasks.splits import require_data_files


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
    checkpoint = read_checkpoint(path, onnx_settings(cfg) if onnx else None)
    reading = reconcile(cfg, checkpoint, task, need, calibrate_share)
    built = built_from(reading, checkpoint.model, checkpoint.tokenizer)
    built.min_confidence = threshold
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
