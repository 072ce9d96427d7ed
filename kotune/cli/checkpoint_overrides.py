"""``checkpoint=RUN`` before Hydra composes: the checkpoint's task, model and mode presets and the
task options its weights depend on become overrides unless the user's name them (applied by the
command line and ``kotune.cli.overrides.compose``; the job then reads the checkpoint once into its
record, kotune/loading/checkpoint.py, and reconciles it with the composed config,
kotune/loading/reconcile.py). Nothing read here reaches Hydra unchecked: ``read_spec`` checks the
file key by key, and a saved value becomes an override only as a quoted scalar."""
from __future__ import annotations

import re

from kotune.core.errors import KotuneError
from kotune.core.log import log
from kotune.loading.checkpoint import presets, read_spec


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
    the user's (kotune/loading/reconcile.py names it in one line). Unchanged without a readable checkpoint (the
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
    # the length it was trained with, unless one is asked for (kotune/loading/reconcile.py says when it differs)
    if not {"train.max_length", "task.max_length"} & set(given) and isinstance(meta.get("max_length"), int):
        added.append(f"train.max_length={meta['max_length']}")
    if added:
        log(f"checkpoint {path}: {' '.join(added)} (as it was trained)")
    flags = next((i for i, o in enumerate(overrides) if not o.startswith("-")), len(overrides))
    return overrides[:flags] + added + overrides[flags:]  # after -m / --multirun: Hydra reads overrides after flags
