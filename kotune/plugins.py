"""Plug-ins: packages outside the repository that add tasks, heads, export formats or runtimes by
registering them (``kotune.register_task`` …; docs/development/plugins.md).

A plug-in is imported when it is named, never because a file names it:

- installed packages that declare an entry point in the group ``kotune.plugins`` (pyproject.toml:
  ``[project.entry-points."kotune.plugins"] my_package = "my_package.tasks"``);
- the modules a job lists in ``plugins=[my_package.tasks]`` (AllenNLP's ``--include-package``).

A plug-in package's presets (``conf/task/<name>.yaml`` beside its module, or in the package named
``<package>.conf``) join kotune's config groups through Hydra's search path
(hydra_plugins/kotune_searchpath.py). A checkpoint records the module its task came from
(``meta.plugin``); loading it back needs that module loaded by one of the two ways above, else one
line says which package to install (kotune/loading/checkpoint.py).
"""
from __future__ import annotations

import importlib
import os
import re
import sys

from kotune.cli.config import CONF_DIR
from kotune.core.errors import ConfigError
from kotune.core.log import warn

ENTRY_POINT_GROUP = "kotune.plugins"
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_loaded: dict[str, str] = {}  # module → how it was named (entry point / plugins=)
_broken: dict[str, str] = {}  # installed entry point → why it did not load
ENTRY_POINT = f"entry point in '{ENTRY_POINT_GROUP}'"


def entry_point_modules() -> list[str]:
    """The modules installed packages declare in the ``kotune.plugins`` entry-point group."""
    from importlib.metadata import entry_points

    return sorted({ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)})


def named_in(argv: list[str]) -> list[str]:
    """The modules a command's ``plugins=`` override lists (``plugins=[a.b,c]`` or ``plugins=a.b``)."""
    out: list[str] = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key == "plugins":
            out += [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",") if v.strip()]
    return out


def load_plugins(modules: list[str] = ()) -> list[str]:
    """Import the installed entry points and ``modules`` (once each); returns every plug-in module
    loaded so far. A name that is not a module path, or a ``plugins=`` module that fails to import
    (whatever it raises), is one line. An installed entry point that fails is one warning, and jobs
    that do not need it go on: one that does (its task, its checkpoint) names its error
    (:func:`broken_plugin`)."""
    wanted = [(m, ENTRY_POINT) for m in entry_point_modules()]
    wanted += [(str(m), "plugins=") for m in modules]
    for module, how in wanted:
        if module in _loaded or (how == ENTRY_POINT and module in _broken):
            continue
        if not MODULE.fullmatch(module):
            raise ConfigError(f"plugins: {module!r} is not a module name (a dotted Python module path)")
        if module in _broken:  # named by plugins= now: a failed entry point is not imported twice
            raise ConfigError(f"plugins={module}: {_broken[module]}")
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - a plug-in's own bug (RuntimeError, SyntaxError...) too: one line naming it
            if how == ENTRY_POINT:  # installed, not asked for: the jobs that do not need it go on
                _broken[module] = (f"the installed plug-in '{module}' ({how}) failed to load: {error_line(e)}")
                warn(f"{_broken[module]}; only jobs that need it stop")
                continue
            if isinstance(e, ImportError):
                raise ConfigError(f"plugins: cannot import '{module}' (named by {how}): {e}; install the package, "
                                  "or put it on PYTHONPATH") from None
            raise ConfigError(f"plugins: '{module}' (named by {how}) failed while importing: {error_line(e)}") from None
        _loaded[module] = how
    return sorted(_loaded)


def error_line(e: BaseException) -> str:
    """An exception as one line: its type, its first line, and where a SyntaxError is."""
    text = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, SyntaxError) and e.filename:
        text = f"{e.msg} ({e.filename}, line {e.lineno})"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def broken_plugin(module: str) -> str | None:
    """Why the installed plug-in that holds ``module`` (a checkpoint's ``meta.plugin``) failed to load,
    or None."""
    return next((why for m, why in _broken.items() if module == m or module.startswith(m + ".")), None)


def broken_preset(group: str, name: str) -> str | None:
    """Why the failed installed plug-in whose presets folder has ``group/name.yaml`` (found without
    importing it) did not load, or None: ``task=`` of a plug-in that failed is its error, not an
    unknown name."""
    from importlib.util import find_spec

    if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
        return None
    for module, why in _broken.items():
        try:
            spec = find_spec(module.partition(".")[0])  # a top-level package: located, not run
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None)
        if origin and os.path.isfile(os.path.join(os.path.dirname(origin), "conf", group, f"{name}.yaml")):
            return why
    return None


def loaded(module: str) -> bool:
    """Whether a plug-in module was loaded: named (entry point, ``plugins=``), or imported by the user's
    own code before (a notebook's ``import my_package``); kotune never imports it on a file's word."""
    return module in sys.modules or any(module.startswith(m + ".") for m in _loaded)


def plugin_packages() -> list[str]:
    """The top-level packages of the loaded plug-ins and of everything registered from outside kotune."""
    from kotune.core.registry import EXPORTERS, HEADS, RUNTIMES, TASKS

    registered = {getattr(entry, "__module__", "") for registry in (TASKS, HEADS, EXPORTERS, RUNTIMES)
                  for _, entry in registry.items()}
    tops = {m.partition(".")[0] for m in (*_loaded, *registered) if m}
    return sorted(tops - {"tasks", "heads", "kotune"})


def conf_dirs() -> list[str]:
    """kotune's conf/, then each plug-in package's presets folder (``<package>/conf``)."""
    out = [CONF_DIR]
    for top in plugin_packages():
        package = sys.modules.get(top)
        folder = os.path.join(os.path.dirname(os.path.abspath(package.__file__)), "conf") \
            if package is not None and getattr(package, "__file__", None) else None
        if folder and os.path.isdir(folder) and folder not in out:
            out.append(folder)
    return out


def preset_file(group: str, name: str) -> str | None:
    """The file of preset ``name`` in config group ``group`` (kotune's first), None when none has it."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
        return None
    for folder in conf_dirs():
        path = os.path.join(folder, group, f"{name}.yaml")
        if os.path.isfile(path):
            return path
    return None


def preset_names(group: str) -> list[str]:
    """The presets of a config group across kotune's conf/ and the loaded plug-ins'."""
    names: set[str] = set()
    for folder in conf_dirs():
        sub = os.path.join(folder, group)
        if os.path.isdir(sub):
            names |= {f[:-5] for f in os.listdir(sub) if f.endswith(".yaml") and re.fullmatch(r"[A-Za-z0-9_-]+", f[:-5])}
    return sorted(names)
