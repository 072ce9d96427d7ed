"""The overrides a user writes, checked and rewritten before Hydra composes them — for the command
line (kotune/cli/main.py) and for jobs composed in-process (:func:`compose`), so both read
``checkpoint=RUN`` alike:

- ``model.config_overrides.X=V`` (open dicts) without Hydra's ``++``; non-ASCII values quoted, and
  paths that Hydra's grammar would misread (``checkpoint=runs/fold=0``);
- ``checkpoint=RUN`` brings the task, task options, model and mode it was trained with
  (kotune/loading/checkpoint.py);
- ``hydra.sweeper.params.KEY=RANGE`` (Hydra refuses to sweep its own config) read as ``KEY=RANGE``,
  which is how a search range is given on the command line;
- a key that is not in the config (``data.text_colum=``) is one line naming the closest key, not
  Hydra's advice to add it with ``+``.
"""
from __future__ import annotations

import difflib
import os
from typing import Any

from kotune.cli.checkpoint_overrides import checkpoint_overrides, hydra_value, override_key, override_text
from kotune.cli.config import CONF_DIR
from kotune.core.log import log

OPEN_DICTS = ("model.config_overrides.", "model.tokenizer_kwargs.")
SWEEPER_PARAMS = "hydra.sweeper.params."


def open_dict_overrides(argv: list[str]) -> list[str]:
    """``model.config_overrides.X=V`` works without Hydra's ``+``/``++``: these dicts are open by
    design (any field of the architecture's config), so the override is made add-or-replace. So is
    a task option only some tasks have (``task.crf``, ``Task.own_options``): a task without it then
    refuses it in one line saying which tasks take it."""
    from tasks import own_options

    guarded = tuple(f"task.{option}=" for option in own_options())
    return [f"++{a}" if a.startswith(OPEN_DICTS + guarded) else a for a in argv]


def quote_non_ascii(argv: list[str]) -> list[str]:
    """Hydra's override grammar rejects unquoted non-ASCII values (``embed.target=은행``, a path
    with Hangul): quote plain ones; lists, sweeps and already quoted values stay as typed."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("-") and not value.isascii() and not any(c in value for c in "'\"[]{}(),"):
            arg = f"{key}='{value}'"
        elif sep and not key.startswith("-") and not value.isascii() and flat_list(value):
            # data.labels=[긍정,부정]: each plain item quoted, as a plain value is
            arg = f"{key}=[{','.join(repr_item(item) for item in value[1:-1].split(','))}]"
        out.append(arg)
    return out


def flat_list(value: str) -> bool:
    """``[a,b]`` with plain items: no quotes, brackets, braces or parentheses inside."""
    return value.startswith("[") and value.endswith("]") and not any(c in value[1:-1] for c in "'\"[]{}()")


def repr_item(item: str) -> str:
    item = item.strip()
    return item if item.isascii() else f"'{item}'"


def quote_paths(argv: list[str]) -> list[str]:
    """A value that is an existing path (with a ``/``, or a directory) quoted for Hydra's override grammar, which
    reads ``=``, ``,``, brackets and spaces as syntax: kotune's own fold and sweep directories
    (``checkpoint=runs/fold=0``, ``…/0_lr=0.000343,bs=16``) are then one path, not a parse error or a
    sweep. Quoted or escaped values stay as typed (a quoted one is not an existing path)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("-") and ("/" in value and os.path.exists(value) or os.path.isdir(value)) \
                and override_text(value) != value and hydra_value(value) is not None:
            arg = f"{key}={hydra_value(value)}"
        out.append(arg)
    return out


def search_range_overrides(argv: list[str]) -> list[str]:
    """``hydra.sweeper.params.train.learning_rate='tag(log, interval(3e-4,3e-3))'`` — what one
    would write to change a search preset's range — becomes ``train.learning_rate=tag(…)``, the
    form the Optuna sweeper reads (and which replaces the preset's range of that key)."""
    out = []
    for arg in argv:
        if arg.lstrip("+").startswith(SWEEPER_PARAMS) and "=" in arg:
            key, _, value = arg.lstrip("+")[len(SWEEPER_PARAMS):].partition("=")
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]  # a quoted range is still a range here
            log(f"{arg.partition('=')[0]}=… is read as {key}={value} (a search range is given as KEY=RANGE)")
            arg = f"{key}={value}"
        out.append(arg)
    return out


def job_overrides(overrides: list[str]) -> list[str]:
    """Every rewrite a job's overrides get before composition (the command line adds its own); the
    plug-ins it names (and the installed ones) are loaded first, so their presets compose."""
    from kotune.plugins import load_plugins, named_in

    load_plugins(named_in(overrides))
    return checkpoint_overrides(open_dict_overrides(quote_non_ascii(quote_paths(search_range_overrides(overrides)))))


def compose(overrides: list[str], config_dir: str = CONF_DIR):
    """``kotune.cli.job.execute(compose([...]), run_dir)``: a job's config composed in-process as the
    command line composes it (``checkpoint=RUN`` included)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=job_overrides(overrides))


# ---- keys that are not in the config ----------------------------------------------------------
def config_groups() -> set[str]:
    return {d for d in os.listdir(CONF_DIR) if os.path.isdir(os.path.join(CONF_DIR, d))}


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a plain nested dict, inner nodes included."""
    if not isinstance(node, dict):
        return [prefix[:-1]] if prefix else []
    out = [prefix[:-1]] if prefix else []
    for k, v in node.items():
        out += flat_keys(v, f"{prefix}{k}.")
    return out


def presets_with(group: str, key: str) -> list[str]:
    """The presets of ``group`` whose own file sets ``key`` (``scheme`` → the token tasks)."""
    from omegaconf import OmegaConf

    folder = os.path.join(CONF_DIR, group)
    names = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml")) if os.path.isdir(folder) else []
    return [n for n in names if OmegaConf.select(OmegaConf.load(os.path.join(folder, f"{n}.yaml")), key) is not None]


def bad_override(argv: list[str]) -> str | None:
    """The first override (``a.b=v``, no ``+``) whose key the composed config lacks, as one line
    naming the closest key (or the presets that have it), or whose value cannot be the key's type
    (``train.max_steps=abc``); None when all are fine. Answered before any data is read. The config
    is composed from the group choices and additions alone; a sweep over a group skips the check
    (Hydra's own message then stands)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    groups = config_groups()
    plain = [a for a in argv if "=" in a and not a.startswith("-")]
    choices = [a for a in plain if override_key(a) in groups or "/" in override_key(a) or a.startswith(("+", "~"))]
    if any(any(c in a.partition("=")[2] for c in ",()") for a in choices if override_key(a) in groups):
        return None
    checked = [a for a in plain if a not in choices and not override_key(a).startswith("hydra.")]
    if not checked:
        return None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=[a for a in choices if not a.startswith("hydra")])
    except Exception:  # noqa: BLE001 - a choice Hydra refuses: its own message follows
        return None
    finally:
        GlobalHydra.instance().clear()
    return unknown_key(cfg, checked, groups) or mistyped_value(cfg, checked)


def unknown_key(cfg, checked: list[str], groups: set[str]) -> str | None:
    """The first of ``checked`` whose key ``cfg`` lacks, as one line naming the closest key."""
    from omegaconf import OmegaConf

    known = set(flat_keys(OmegaConf.to_container(cfg, resolve=False)))
    for arg in checked:
        key = override_key(arg)
        if key in known or any(part.isdigit() for part in key.split(".")):
            continue
        group, _, rest = key.partition(".")
        elsewhere = presets_with(group, rest) if group in groups and rest else []
        if elsewhere:
            chosen = OmegaConf.select(cfg, f"{group}.name") or "preset"
            return (f"{key} is not a key of {group} {chosen} ({group} {', '.join(elsewhere)} "
                    f"{'has' if len(elsewhere) == 1 else 'have'} it: choose one with {group}=)")
        close = difflib.get_close_matches(key, sorted(known), n=1)
        return f"{key} is not a config key" + (f" (did you mean {close[0]}?)" if close else "")
    return None


# an int default takes a float too (train.epochs=1.5: Trainer reads fractional epochs)
TYPE_WORDS = {bool: "true or false", int: "a number", float: "a number"}


def mistyped_value(cfg, checked: list[str]) -> str | None:
    """The first of ``checked`` whose value cannot be what the key's default is (a number,
    true/false), as one line naming the key; null is always allowed, and values with
    interpolations, sweeps or lists are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    for arg in checked:
        key, _, text = arg.partition("=")
        try:
            default = OmegaConf.select(cfg, override_key(key), throw_on_missing=False)
        except Exception:  # noqa: BLE001 - a default that does not resolve here: nothing to compare with
            continue
        wanted = type(default) if type(default) in TYPE_WORDS else None
        if wanted is None or "${" in text:
            continue
        try:
            value = parser.parse_override(arg).value()
        except Exception:  # noqa: BLE001 - Hydra's own message names a malformed override
            continue
        fits = (value is None or isinstance(value, (list, dict)) or not isinstance(value, (str, int, float, bool))
                or (isinstance(value, bool) if wanted is bool else
                    isinstance(value, (int, float)) and not isinstance(value, bool)))
        if not fits:
            shown = str(default).lower() if isinstance(default, bool) else default
            return f"{override_key(key)}={text}: {TYPE_WORDS[wanted]} expected (default {shown})"
    return None
