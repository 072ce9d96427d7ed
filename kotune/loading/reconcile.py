"""The job's config as a build reads it (the length asked for, the frozen-feature cache's settings),
and a checkpoint reconciled with the job that reads it, in one function (:func:`reconcile`): the
mode it was saved by, its head and the task options its weights depend on (``Task.saved_options``),
the columns its task read, the length it was trained with, the class weights it keeps. It returns
a :class:`Reading`, which kotune/loading/built.py's ``built_from`` builds from."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kotune.devices import pad_multiple
from kotune.loading.built import Reading
from kotune.loading.checkpoint import Checkpoint
from tasks.base import EncodeSettings, Task
from tasks.class_weights import class_weight_setting, saved_class_weights
from kotune.core.errors import ConfigError
from kotune.core.log import log


def reconcile(cfg: DictConfig, checkpoint: Checkpoint, task: Task, need: tuple[str, ...],
              calibrate_share: float = 0.0) -> Reading:
    """The job's config against the checkpoint, in one place: its mode (a kotune checkpoint's), the
    task it asks for against the saved head and options (:func:`task_for_checkpoint`), the saved
    columns, the length and token types the model was trained with (a different length asked for
    is a warning), and what the build reads of the config (:class:`Reading`)."""
    if not checkpoint.export:  # an export is a plain native model: it has no mode to continue
        check_checkpoint_mode(str(cfg.mode.name), checkpoint, "train" in need)
    settings = EncodeSettings(max_length=checkpoint_length(cfg, checkpoint, warn=True),
                              token_type_ids=checkpoint.token_type_ids)
    frozen_cache = frozen_cache_settings(cfg) if cfg.mode.get("cache") and checkpoint.model.frozen else None
    use_saved_columns(task, checkpoint.meta, checkpoint.path)
    task = task_for_checkpoint(task, checkpoint.meta | {"head": checkpoint.head}, checkpoint.path)
    asked = class_weight_setting(cfg.train.get("class_weights")) is not None
    return Reading(task, settings, cfg.data, tuple(need), int(cfg.train.seed), float(calibrate_share),
                   cfg.get("cache_dir"), saved_class_weights(checkpoint.class_weights, task.labels, asked),
                   frozen_cache, bool(cfg.model.get("padding_free")), pad_multiple(cfg.train))


def requested_max_length(cfg: DictConfig) -> int:
    """``task.max_length`` where the task sets one (QA windows: 384), else ``train.max_length``."""
    return int(cfg.task.get("max_length") or cfg.train.max_length)


def frozen_cache_settings(cfg: DictConfig):
    """``mode.cache``'s settings (heads/model/feature_cache.py's ``CacheSettings``), None when off."""
    if not cfg.mode.get("cache"):
        return None
    from heads.model.feature_cache import CacheSettings

    if not cfg.get("cache_dir"):
        raise ConfigError("mode.cache=true needs cache_dir=DIR (where frozen features are stored)")
    return CacheSettings(str(cfg.cache_dir), str(cfg.mode.get("cache_dtype", "float16")),
                         float(cfg.mode.get("cache_max_gb", 20)), int(cfg.train.eval_batch_size))


def checkpoint_length(cfg: DictConfig, checkpoint: Checkpoint, warn: bool) -> int:
    """The length the checkpoint's model was trained with (``meta.max_length``), which it is read
    with; ``warn``: say so when the job asked for another."""
    from heads.model.encoder import position_limit

    saved = checkpoint.meta.get("max_length")
    requested = min(requested_max_length(cfg), position_limit(checkpoint.config))
    if warn and saved and requested != saved:
        log(f"warning: checkpoint {checkpoint.path} was trained with max_length={saved}: reading with "
            f"it, not the max_length={requested} asked for")
    return int(saved or requested_max_length(cfg))


def check_checkpoint_mode(asked: str, checkpoint: Checkpoint, training: bool) -> None:
    """A checkpoint is read as the mode that saved it. Asking ``mode=lora`` of a checkpoint without
    an adapter, or continuing training in another mode than the saved one, is one line saying which."""
    model = checkpoint.model
    saved = model.mode
    if saved == asked:
        return
    if asked == "lora":
        model_dir = checkpoint.folder
        raise ConfigError(f"mode=lora: checkpoint {checkpoint.path} was saved by mode={saved} (its whole encoder, no LoRA "
                          f"adapter); read it without mode=lora, or put LoRA on its encoder in a new run with "
                          f"model.name_or_path={model_dir}/encoder +model.tokenizer_path={model_dir}")
    if training and saved == "lora":
        raise ConfigError(f"checkpoint {checkpoint.path} was saved by mode=lora (an adapter on "
                          f"{model.lora['base']['model'].get('name_or_path') or model.lora['base']['model'].get('name')}); "
                          f"continue it with mode=lora, or action=export it (the adapter merged) and start "
                          f"mode={asked} from the export with model.name_or_path=EXPORT_DIR")
    if training:
        raise ConfigError(f"checkpoint {checkpoint.path} was saved by mode={saved}: continue it with mode={saved} "
                          f"(mode={asked} would train it another way than its own)")
    if saved == "lora":
        log(f"checkpoint {checkpoint.path}: a LoRA adapter (r={model.lora['r']} on {model.lora['target_modules']}) "
            f"and its head, read as mode=lora")


def use_saved_columns(task: Task, meta: dict, checkpoint: str) -> None:
    """The columns the checkpoint's task read in training (``data.<role>_column`` or a conventional
    name it found), when it is this task: a file that has them is read with them, so a file like the
    training file needs no column settings; a file in the preset's own format is read with the
    preset's; a ``data.<role>_column`` still wins (``Task.columns_for_file``)."""
    if meta.get("columns") and meta.get("task") == task.name:
        task.checkpoint_columns = {role: column for role, column in dict(meta["columns"]).items()
                                   if role in task.default_columns}
        task.checkpoint_name = f"checkpoint {checkpoint}"


def task_for_checkpoint(task: Task, meta: dict, checkpoint: str) -> Task:
    """The requested task, with the options the checkpoint's model depends on taken from what was
    saved (``Task.saved_options``): a different head is an error, an encoding difference a warning
    (the saved value is used), a requested ``auto`` what it resolved to in training. Another task
    that fits (an NLI model on a text_pair file) is fine."""
    saved_head = meta.get("head")
    if saved_head and saved_head != task.head_description():  # e.g. QA's task.decode=char: span (units=char)
        other = meta.get("task") not in (None, task.name)
        hint = (f"leave task= out to use the checkpoint's task={meta['task']}" if other
                else "leave the task options out: the checkpoint's apply")
        raise ConfigError(f"task={task.name}: checkpoint {checkpoint} has a '{saved_head}' head, this task with "
                          f"these options needs '{task.head_description()}' ({hint})")
    saved_pair = "text_pair" in (meta.get("columns") or {})  # checkpoints that record their columns
    if meta.get("columns") is not None and saved_pair != task.pair:
        other = meta.get("task") not in (None, task.name)
        reads = {True: "text pairs", False: "single texts"}
        raise ConfigError(f"task={task.name}: checkpoint {checkpoint} was trained on {reads[saved_pair]}, this task "
                          f"reads {reads[task.pair]}" + (f" (leave task= out to use the checkpoint's task={meta['task']})"
                                                         if other else ""))
    saved = meta.get("task_options") or {}
    changes = {}
    for option, policy in task.saved_options.items():
        if option not in saved or saved[option] == task.cfg.get(option):
            continue
        if policy == "auto":  # what "auto" found in the training data stands in for a requested auto
            # (or for a value the task resolves in training: multi-label threshold=tune, its tuned thresholds)
            if task.cfg.get(option) in (None, "auto", *getattr(task, "checkpoint_resolves", {}).get(option, ())):
                changes[option] = saved[option]
            continue
        if policy == "error":
            raise ConfigError(f"task.{option}={task.cfg.get(option)}: checkpoint {checkpoint} was trained with "
                              f"task.{option}={saved[option]}, which gives a different model")
        log(f"warning: checkpoint {checkpoint} was trained with task.{option}={saved[option]}; using it "
            f"(requested {task.cfg.get(option)})")
        changes[option] = saved[option]
    if changes:  # a task rebuilt with them keeps the columns it was told to read (use_saved_columns)
        cfg = OmegaConf.to_container(task.cfg, resolve=True)
        told = task.checkpoint_columns, task.checkpoint_name
        task = type(task)(OmegaConf.create({**cfg, **changes}))
        task.checkpoint_columns, task.checkpoint_name = told
    task.labels = meta.get("labels", task.labels)
    return task
