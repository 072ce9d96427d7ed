"""What a checkpoint remembers, read from its ``kotune.json`` without loading a model: where the
saved model lies, and the config choices an action given ``checkpoint=`` takes from it — the task
preset and the task options the weights depend on, the model and mode presets — unless the
overrides name them (``checkpoint_overrides``, applied by the command line and
``kotune.overrides.compose`` before Hydra composes; the columns follow in kotune/build.py)."""
from __future__ import annotations

import json
import os

from kotune.config import CONF_DIR
from tasks.errors import KotuneError
from tasks.log import log

SPEC_FILE = "kotune.json"


def checkpoint_model_dir(path: str) -> str:
    """The saved kotune model of ``checkpoint=`` (the run directory or its ``model/``); an ONNX
    export is refused in one line (only predict, eval and serve read one: kotune/build.py)."""
    from heads.onnx import is_onnx_export

    if is_onnx_export(path):
        raise KotuneError(f"checkpoint={path} is an ONNX export: this action needs a kotune checkpoint (a run "
                          "directory or its model/); action=predict, eval and serve read an export")
    for candidate in (path, os.path.join(path, "model")):
        if os.path.exists(os.path.join(candidate, SPEC_FILE)):
            return candidate
    raise KotuneError(f"checkpoint={path}: no saved model there (expected {path}/model/{SPEC_FILE})")


def read_spec(path: str) -> dict:
    """The saved model's ``kotune.json`` (head, frozen, meta: task, labels, task options, ...), or
    an ONNX export's ``kotune_export.json`` (head and meta as saved)."""
    from heads.onnx import EXPORT_FILE, is_onnx_export

    spec_file = os.path.join(path, EXPORT_FILE) if is_onnx_export(path) else \
        os.path.join(checkpoint_model_dir(path), SPEC_FILE)
    with open(spec_file, encoding="utf-8") as f:
        return json.load(f)


def override_key(override: str) -> str:
    """``++task.join=x`` → ``task.join``; ``task=ner`` → ``task``."""
    return override.partition("=")[0].lstrip("+~")


def hydra_value(value) -> str | None:
    """A saved scalar written as an override value (strings quoted: ``task.join=' '``); None for
    what an override cannot carry simply (lists, dicts)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${")
        return f"'{escaped}'"
    return None


def preset_exists(group: str, name: str | None) -> bool:
    return bool(name) and os.path.isfile(os.path.join(CONF_DIR, group, f"{name}.yaml"))


def checkpoint_overrides(overrides: list[str]) -> list[str]:
    """``checkpoint=RUN`` and no ``task=`` / ``model=`` / ``mode=``: the checkpoint's presets
    first, then its saved task options (``Task.saved_options``) that the overrides do not set, so
    ``task.*`` overrides apply to the task the model was trained for and a conflicting one stays
    the user's (kotune/build.py names it in one line). Unchanged without a readable checkpoint (the
    action then says what is missing) or for a sweep over checkpoints."""
    given = {override_key(o): o.partition("=")[2] for o in overrides if "=" in o and not o.startswith("-")}
    path = given.get("checkpoint", "")
    if not path or path == "null" or any(c in path for c in ",()"):
        return overrides
    try:
        spec = read_spec(path)
    except (KotuneError, OSError, ValueError):
        return overrides
    meta = spec.get("meta") or {}
    task = meta.get("task")
    mode = spec.get("mode") or ("frozen" if spec.get("frozen") else "finetune")  # older kotune.json: no "mode"
    presets = {"task": task, "model": meta.get("model"), "mode": mode}
    added = [f"{group}={name}" for group, name in presets.items() if group not in given and preset_exists(group, name)]
    if given.get("task", task) == task and preset_exists("task", task):
        for option, value in (meta.get("task_options") or {}).items():
            written = hydra_value(value)
            if f"task.{option}" not in given and written is not None:
                added.append(f"++task.{option}={written}")
    if added:
        log(f"checkpoint {path}: {' '.join(added)} (as it was trained; an override of these on the command "
            "line wins)")
    return added + overrides
