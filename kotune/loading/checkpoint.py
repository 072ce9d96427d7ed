"""A checkpoint read once: where its saved model lies, its ``kotune.json`` (or an ONNX export's
``kotune_export.json``) checked key by key, and, for a job, the model itself with its tokenizer and
runtime, as one :class:`Checkpoint` record that kotune/loading/reconcile.py reconciles with the
job's config and kotune/loading/from_checkpoint.py builds from. (Before Hydra composes, the command
line reads the spec alone to choose presets: kotune/cli/checkpoint_overrides.py.)

Nothing read here reaches Hydra unchecked (docs/actions/checkpoints.md): the file is checked key by
key (heads/model/artifact.py), the task and mode must be presets listed in conf/ and each task option one
its task saves, of its preset's type, before any becomes an override; a name is never joined into a
path. A checkpoint that fails is one line naming the file and the key (:class:`ArtifactError`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kotune.core.atomic_dir import settle
from kotune.core.errors import KotuneError

SPEC_FILE = "kotune.json"


def checkpoint_model_dir(path: str) -> str:
    """The saved kotune model of ``checkpoint=`` (the run directory or its ``model/``); an ONNX
    export is refused in one line (only predict, eval and serve read one: kotune/loading/from_checkpoint.py)."""
    from kotune.export.onnx import is_onnx_export

    for candidate in (path, os.path.join(path, "model")):
        settle(candidate)  # a save killed while swapping its directory in: the whole one back (kotune/core/atomic_dir.py)
    if is_onnx_export(path):
        raise KotuneError(f"checkpoint={path} is an ONNX export: this action needs a kotune checkpoint (a run "
                          "directory or its model/); action=predict, eval and serve read an export")
    for candidate in (path, os.path.join(path, "model")):
        if os.path.exists(os.path.join(candidate, SPEC_FILE)):
            from heads.model.artifact import check_inside

            check_inside(path, candidate)  # RUN/model linked out of RUN: another directory's files
            return candidate
    raise KotuneError(f"checkpoint={path}: no saved model there (expected {path}/model/{SPEC_FILE})")


def read_spec(path: str, registry: bool = True) -> dict:
    """The saved model's ``kotune.json`` (head, frozen, meta: task, labels, task options, ...), or
    an ONNX export's ``kotune_export.json`` (head and meta as saved), checked: every key as kotune
    writes it (heads/model/artifact.py), its task and mode presets of conf/, its task options the task's,
    no pickle-format weights; else one :class:`ArtifactError` line naming the file and the key."""
    from heads.model.artifact import ArtifactError, check_export_spec, check_files, check_model_spec, parse
    from kotune.export.onnx import EXPORT_FILE, is_onnx_export

    export = is_onnx_export(path)
    folder = path if export else checkpoint_model_dir(path)
    spec_file = os.path.join(folder, EXPORT_FILE if export else SPEC_FILE)
    where = f"checkpoint {path}: {os.path.relpath(spec_file, path)}"
    check_files(folder, f"checkpoint {path}")  # before any file is opened: a link out of the folder is refused
    try:
        with open(spec_file, encoding="utf-8") as f:
            text = f.read()
    except ValueError as e:  # not UTF-8
        raise ArtifactError(f"{where}: not a JSON file kotune wrote ({str(e).splitlines()[0]})") from None
    spec = parse(text, where)
    check_preset_names(spec, where)
    (check_export_spec if export else check_model_spec)(spec, where, registry)
    check_task_options(spec, where)
    return spec


def presets(group: str) -> list[str]:
    """The presets of a config group: the ``*.yaml`` names in conf/<group>/ and the loaded plug-ins'."""
    from kotune.plugins import preset_names

    return preset_names(group)


def option_type_fits(value, preset) -> bool:
    """A saved task option against its preset's value: null, or of the preset's type (any plain
    value where the preset has none, or ``auto``, which training resolves to what it found)."""
    if value is None or preset is None or preset == "auto":
        return True
    if isinstance(preset, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(preset, bool)
    if isinstance(preset, int):
        return isinstance(value, int)
    if isinstance(preset, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(preset))


def check_preset_names(spec, where: str) -> None:
    """The saved task and mode are presets (conf/task, conf/mode): anything else, a path above all,
    is one line listing them. The model name may be one of the user's own (``model.name``):
    heads/model/artifact.py checks that it is a plain name; it becomes ``model=`` only when a preset."""
    from heads.model.artifact import ArtifactError, shown

    from kotune.plugins import broken_plugin, loaded

    meta = spec.get("meta") if isinstance(spec, dict) else None
    plugin = meta.get("plugin") if isinstance(meta, dict) else None
    failed = broken_plugin(plugin) if isinstance(plugin, str) else None
    if failed:  # installed, but its import raised: that error, not "install it"
        raise ArtifactError(f"{where}: its task {shown(meta.get('task'))} comes from the plug-in {shown(plugin)}: {failed}")
    if isinstance(plugin, str) and not loaded(plugin):  # never imported from here: named by the user only
        raise ArtifactError(f"{where}: its task {shown(meta.get('task'))} comes from the plug-in {shown(plugin)}, "
                            f"which is not loaded here: install its package (entry point kotune.plugins), or add "
                            f"plugins=[{plugin}]")
    if isinstance(meta, dict) and "task" in meta and meta["task"] not in presets("task"):
        raise ArtifactError(f"{where}: meta.task={shown(meta['task'])} is not a kotune task "
                            f"(known: {', '.join(presets('task'))})")
    if isinstance(spec, dict) and "mode" in spec and spec["mode"] not in presets("mode"):
        raise ArtifactError(f"{where}: mode={shown(spec['mode'])} is not a kotune mode (known: {', '.join(presets('mode'))})")


def check_task_options(spec: dict, where: str) -> None:
    """Each saved task option is one its task saves (``Task.saved_options``), of its preset's type."""
    from omegaconf import OmegaConf

    from heads.model.artifact import ArtifactError, shown
    from tasks import TASKS

    meta = spec["meta"]
    task = meta.get("task")
    if task is None:  # a model saved from Python without a task: nothing to take from it
        if meta.get("task_options"):
            raise ArtifactError(f"{where}: meta.task_options without meta.task (whose options are they?)")
        return
    from kotune.plugins import preset_file

    preset = OmegaConf.to_container(OmegaConf.load(preset_file("task", task)), resolve=False)
    kind = TASKS.get(preset.get("kind") or preset.get("name") or task, None)
    saved = dict(kind.saved_options) if kind is not None else {}
    for option, value in (meta.get("task_options") or {}).items():
        if option not in saved:
            raise ArtifactError(f"{where}: meta.task_options.{option} is not an option task {task} saves "
                                f"(it saves: {', '.join(saved) or 'none'})")
        # a preset value the task resolves in training (multi-label threshold=tune: the tuned list) fits what it resolved to
        resolves = preset.get(option) in getattr(kind, "checkpoint_resolves", {}).get(option, ())
        if not resolves and not option_type_fits(value, preset.get(option)):
            raise ArtifactError(f"{where}: meta.task_options.{option}={shown(value)} does not fit task {task}'s "
                                f"{option} (its preset has {shown(preset.get(option))})")




@dataclass
class Checkpoint:
    """``checkpoint=`` as a job reads it, once: the path named, the folder its files come from, the
    checked spec, and the model loaded from it (a :class:`KotuneModel`, or an ONNX export run by
    onnxruntime) with its tokenizer, its encoder's config and the runtime that runs its batches
    (kotune/inference/model_runtimes.py). What the job takes from it is reconciled with the job's
    config in one place: kotune/loading/reconcile.py."""

    path: str
    folder: str
    spec: dict
    model: Any
    tokenizer: Any
    config: Any
    runtime: Any

    @property
    def meta(self) -> dict:
        return self.model.meta

    @property
    def head(self) -> str:
        """The head kind with its options, as the task that reads it must ask for it."""
        return self.model.head_description()

    @property
    def export(self) -> bool:
        return not self.runtime.kotune_model

    @property
    def token_type_ids(self) -> bool:
        """Whether its model reads token types: as saved, else as its encoder's config says."""
        from heads.model.encoder import uses_token_type_ids

        return bool(self.meta.get("token_type_ids", uses_token_type_ids(self.config)))

    @property
    def class_weights(self) -> list[float] | None:
        """The class weights its head was trained with (an ONNX export keeps none)."""
        return (getattr(self.model, "head_kwargs", None) or {}).get("class_weights")


def read_checkpoint(path: str, onnx: dict | None = None) -> Checkpoint:
    """The checkpoint at ``path`` read once into a :class:`Checkpoint`: its spec checked (``read_spec``,
    before any weights), then its model, tokenizer and runtime. ``onnx``: the job's ``onnx``
    settings, where the action only predicts and an ONNX export may stand in (``None``: an export is
    refused in one line)."""
    from transformers import AutoConfig, AutoTokenizer

    from kotune.export.onnx import is_onnx_export
    from kotune.inference.model_runtimes import runtime_of

    if onnx is not None and is_onnx_export(path):
        from heads.model.artifact import check_length
        from heads.model.encoder import position_limit
        from kotune.export.onnx import EXPORT_FILE, OnnxModel

        folder, spec = path, read_spec(path)
        model = OnnxModel(path, onnx.get("file"), onnx.get("threads"), spec=spec)
        config = AutoConfig.from_pretrained(path)
        # its length within its encoder's positions (a checkpoint's is checked as it loads: KotuneModel.load)
        check_length(model.meta.get("max_length"), position_limit(config), f"{path}/{EXPORT_FILE}", "config.json")
    else:
        from heads.model.kotune_model import KotuneModel

        folder = checkpoint_model_dir(path)
        spec = read_spec(path)
        model = KotuneModel.load(folder, spec=spec)
        config = model.encoder.config
    return Checkpoint(path, folder, spec, model, AutoTokenizer.from_pretrained(folder), config, runtime_of(model))
