"""What a checkpoint remembers, read from its ``kotune.json`` without loading a model: where the
saved model lies, and the config choices an action given ``checkpoint=`` takes from it — the task
preset and the task options the weights depend on, the model and mode presets — unless the
overrides name them (``checkpoint_overrides``, applied by the command line and
``kotune.cli.overrides.compose`` before Hydra composes; the columns follow in kotune/loading/build.py).

Nothing read here reaches Hydra unchecked (docs/actions/checkpoints.md): the file is checked key by
key (heads/model/artifact.py), the task and mode must be presets listed in conf/ and each task option one
its task saves, of its preset's type, before any becomes an override; a name is never joined into a
path. A checkpoint that fails is one line naming the file and the key (:class:`ArtifactError`)."""
from __future__ import annotations

import json
import os
import re

from kotune.core.atomic_dir import settle
from kotune.core.errors import KotuneError
from kotune.core.log import log

SPEC_FILE = "kotune.json"


def checkpoint_model_dir(path: str) -> str:
    """The saved kotune model of ``checkpoint=`` (the run directory or its ``model/``); an ONNX
    export is refused in one line (only predict, eval and serve read one: kotune/loading/build.py)."""
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
    from heads.model.artifact import ArtifactError, check_export_spec, check_files, check_model_spec
    from kotune.export.onnx import EXPORT_FILE, is_onnx_export

    export = is_onnx_export(path)
    folder = path if export else checkpoint_model_dir(path)
    spec_file = os.path.join(folder, EXPORT_FILE if export else SPEC_FILE)
    where = f"checkpoint {path}: {os.path.relpath(spec_file, path)}"
    check_files(folder, f"checkpoint {path}")  # before any file is opened: a link out of the folder is refused
    try:
        with open(spec_file, encoding="utf-8") as f:
            spec = json.load(f)
    except ValueError as e:  # malformed JSON, or not UTF-8
        raise ArtifactError(f"{where}: not a JSON file kotune wrote ({str(e).splitlines()[0]})") from None
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


def override_key(override: str) -> str:
    """``++task.join=x`` → ``task.join``; ``task=ner`` → ``task``."""
    return override.partition("=")[0].lstrip("+~")


def hydra_value(value) -> str | None:
    """A saved scalar written as an override value that Hydra reads back as exactly that value
    (strings quoted: ``task.join=' '``; a quote, and backslashes before one, escaped); None for what
    an override cannot carry simply (lists, dicts, a string with ``${``, which OmegaConf would
    resolve: heads/model/artifact.py refuses those in a checkpoint)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and "${" not in value:
        # in a quoted override only backslashes before a quote (the closing one too) are escapes
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
        return f"'{escaped}'"
    return None


def override_text(value: str) -> str | None:
    """An override's value as the one string Hydra reads from it (``'/runs/fold=0'`` → the path,
    quotes and backslash escapes undone); None for a sweep, a list or what Hydra cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_override(f"key={value}")
    except Exception:  # noqa: BLE001 - a malformed value: Hydra names it when it composes
        return None
    if parsed.is_sweep_override():
        return None
    text = parsed.value()
    return text if isinstance(text, str) else None


def checkpoint_overrides(overrides: list[str]) -> list[str]:
    """``checkpoint=RUN`` and no ``task=`` / ``model=`` / ``mode=``: the checkpoint's presets
    first, then its saved task options (``Task.saved_options``) that the overrides do not set, so
    ``task.*`` overrides apply to the task the model was trained for and a conflicting one stays
    the user's (kotune/loading/build.py names it in one line). Unchanged without a readable checkpoint (the
    action then says what is missing) or for a sweep over checkpoints."""
    given = {override_key(o): o.partition("=")[2] for o in overrides if "=" in o and not o.startswith("-")}
    path = given.get("checkpoint", "")
    teacher = not path or path == "null"  # action=distill's teacher lends its task the same way, not its mode
    if teacher:
        path = given.get("distill.teacher", "")
    if not path or path == "null":
        return overrides
    path = override_text(path)  # quoted or escaped as Hydra's grammar wants it (kotune.cli.overrides.quote_paths)
    if not path:  # a sweep over checkpoints: each job reads its own
        return overrides
    if teacher and "task" not in given:
        from kotune.export.native_card import card_task, is_native_export

        if is_native_export(path) and card_task(path):  # a native export keeps no kotune.json: its card names the task
            log(f"distill.teacher {path}: task={card_task(path)} (its model card)")
            flags = next((i for i, o in enumerate(overrides) if not o.startswith("-")), len(overrides))
            return overrides[:flags] + [f"task={card_task(path)}"] + overrides[flags:]
    from heads.model.artifact import ArtifactError

    try:
        # checked: a checkpoint kotune will not read is one line from here; its head kind and arguments
        # against the head registry (torch) when a loader reads it, before anything is built
        spec = read_spec(path, registry=False)
    except ArtifactError:
        raise
    except (KotuneError, OSError):
        return overrides
    meta = spec["meta"]
    task = meta.get("task")
    mode = spec.get("mode") or ("frozen" if spec.get("frozen") else "finetune")  # older kotune.json: no "mode"
    saved = {"task": task, "model": meta.get("model"), **({} if teacher else {"mode": mode})}
    added = [f"{group}={name}" for group, name in saved.items() if group not in given and name in presets(group)]
    if given.get("task", task) == task:
        for option, value in (meta.get("task_options") or {}).items():
            written = hydra_value(value)
            if f"task.{option}" not in given and written is not None:
                added.append(f"++task.{option}={written}")
    # the length it was trained with, unless one is asked for (kotune/loading/build.py says when it differs)
    if not {"train.max_length", "task.max_length"} & set(given) and isinstance(meta.get("max_length"), int):
        added.append(f"train.max_length={meta['max_length']}")
    if added:
        log(f"checkpoint {path}: {' '.join(added)} (as it was trained)")
    flags = next((i for i, o in enumerate(overrides) if not o.startswith("-")), len(overrides))
    return overrides[:flags] + added + overrides[flags:]  # after -m / --multirun: Hydra reads overrides after flags
