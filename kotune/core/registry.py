"""Registries a package outside the repository can fill: tasks, heads, export formats, runtimes.

kotune's own modules register themselves with the same decorators a plug-in uses::

    @kotune.register_task("my_task")
    class MyTask(kotune.ClassificationTask): ...

A name is registered once: a second class under a taken name is refused in one line naming both
modules (re-importing the same module, as a notebook's reload does, is not a duplicate). Each entry
remembers the module that registered it, which a checkpoint records (``plugin`` in kotune.json) so that
a model trained with a plug-in's task names the package it needs; kotune never imports a module a
checkpoint names (kotune/plugins.py imports only installed entry points and ``plugins:`` settings).
"""
from __future__ import annotations

from typing import Callable, Iterator, TypeVar

from kotune.core.errors import ConfigError

T = TypeVar("T")
_REQUIRED = object()


class Registry:
    """name → class (or object), with the module each came from."""

    def __init__(self, what: str):
        self.what = what
        self._entries: dict[str, object] = {}

    def add(self, name: str, entry: T) -> T:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{self.what} name {name!r}: use letters, digits and underscores")
        taken = self._entries.get(name)
        if taken is not None and _qualname(taken) != _qualname(entry):
            raise ConfigError(f"{self.what} '{name}' is registered twice: by {_qualname(taken)} and by "
                              f"{_qualname(entry)} (choose another name)")
        self._entries[name] = entry
        return entry

    def register(self, *names: str) -> Callable[[T], T]:
        """A decorator registering its class under each of ``names``; a class records its first name
        as ``registered_name`` when it has no name of its own yet."""
        if not names:
            raise ConfigError(f"register_{self.what.replace(' ', '_')}() needs a name")

        def decorate(entry: T) -> T:
            for name in names:
                self.add(name, entry)
            if isinstance(entry, type) and "registered_name" not in vars(entry):
                entry.registered_name = names[0]  # type: ignore[attr-defined]
            return entry

        return decorate

    def get(self, name: str, default: object = _REQUIRED) -> object:
        """The entry of ``name``; unknown: ``default`` when given, else one line listing the choices."""
        if name not in self._entries:
            if default is not _REQUIRED:
                return default
            raise ConfigError(f"unknown {self.what} '{name}' (choices: {', '.join(sorted(self._entries))})")
        return self._entries[name]

    def origin(self, name: str) -> str:
        """The module that registered ``name``."""
        return getattr(self.get(name), "__module__", "")

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, object]]:
        return sorted(self._entries.items())


def describe_head(kind: str, options: dict) -> str:
    """``token``, or with options ``token (crf=true, units=char)``: a head as messages and results name it."""
    shown = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(options.items()))
    return f"{kind} ({shown})" if shown else kind


def _qualname(entry: object) -> str:
    return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', type(entry).__qualname__)}"


TASKS = Registry("task")
HEADS = Registry("head")
EXPORTERS = Registry("export format")
RUNTIMES = Registry("runtime")

register_task = TASKS.register
register_head = HEADS.register
register_exporter = EXPORTERS.register
register_runtime = RUNTIMES.register
