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
line says which package to install (kotune/checkpoint.py).
"""
from __future__ import annotations

import importlib
import os
import re
import sys

from kotune.config import CONF_DIR
from kotune.core.errors import ConfigError

ENTRY_POINT_GROUP = "kotune.plugins"
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_loaded: dict[str, str] = {}  # module → how it was named (entry point / plugins=)


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
    loaded so far. A name that is not a module path, or a module that fails to import, is one line."""
    wanted = [(m, f"entry point in '{ENTRY_POINT_GROUP}'") for m in entry_point_modules()]
    wanted += [(str(m), "plugins=") for m in modules]
    for module, how in wanted:
        if module in _loaded:
            continue
        if not MODULE.fullmatch(module):
            raise ConfigError(f"plugins: {module!r} is not a module name (a dotted Python module path)")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import '{module}' (named by {how}): {e}; install the package, "
                              "or put it on PYTHONPATH") from None
        _loaded[module] = how
    return sorted(_loaded)


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
