"""The task registry (kotune.core.registry.TASKS: name → task class), filled by importing kotune's own
tasks, each registered with ``kotune.register_task``; a plug-in registers its own the same way
(docs/development/plugins.md). The task's config (conf/task/<name>.yaml) holds its explicit column map,
label names, hub dataset and main metric."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

import tasks.classification  # noqa: F401  (each module registers its tasks)
import tasks.dp  # noqa: F401
import tasks.multi_label  # noqa: F401
import tasks.ner  # noqa: F401
import tasks.qa  # noqa: F401
import tasks.re  # noqa: F401
import tasks.sentence_embedding  # noqa: F401
from kotune.core.errors import ConfigError
from kotune.core.registry import TASKS
from tasks.base import Task, TaskOption

__all__ = ["TASKS", "build_task", "option_owners", "own_options"]


def own_options() -> dict[str, TaskOption]:
    """Every option some registered task owns (``Task.own_options``): option → its schema."""
    return {option: schema for _, cls in TASKS.items() for option, schema in cls.own_options.items()}


def option_owners(option: str) -> list[str]:
    """The registered tasks that read ``option``."""
    return [name for name, cls in TASKS.items() if option in cls.own_options]


def build_task(task_cfg: DictConfig) -> Task:
    """The task object for a resolved ``cfg.task`` node: ``kind`` names the registered task a preset
    is (``task=dp_klue``: ``name: dp_klue``, ``kind: dp``), else its ``name`` does. An option only
    other tasks read, set to anything but off, is refused in one line naming the tasks that take it."""
    kind = task_cfg.get("kind") or task_cfg.get("name")
    if kind not in TASKS:
        raise ConfigError(f"unknown task '{kind}' (choices: {', '.join(TASKS)})")
    cls: type[Task] = TASKS.get(kind)  # type: ignore[assignment]
    for option, schema in own_options().items():
        value = task_cfg.get(option)
        if option not in cls.own_options and value not in schema.off:
            shown = str(value).lower() if isinstance(value, bool) else value
            owners = " or ".join(f"task={name}" for name in option_owners(option))
            raise ConfigError(f"task.{option}={shown}: task {task_cfg.get('name')} has no such option "
                              f"({schema.about}; {owners} take it)")
    return cls(OmegaConf.create(OmegaConf.to_container(task_cfg, resolve=True)))
