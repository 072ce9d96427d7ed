"""Task registry: name → task class. The task's config (conf/task/<name>.yaml) holds its
explicit column map, label names, hub dataset and main metric."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from tasks.base import Task
from tasks.classification import ClassificationTask
from kotune.core.errors import ConfigError
from tasks.dp import DependencyTask
from tasks.multi_label import MultiLabelTask
from tasks.ner import NerTask, TokenTask
from tasks.qa import QATask
from tasks.re import RelationTask

TASKS: dict[str, type[Task]] = {
    "ynat": ClassificationTask,
    "nli": ClassificationTask,
    "sts": ClassificationTask,
    "text_cls": ClassificationTask,
    "text_pair": ClassificationTask,
    "multi_label": MultiLabelTask,
    "ner": NerTask, "token_cls": TokenTask,
    "mrc": QATask, "korquad": QATask, "qa": QATask,
    "re": RelationTask, "dp": DependencyTask,
}


SEQUENCE_TASKS = "ynat, nli, sts, text_cls, text_pair"
# Options only some tasks read (``Task.own_options``) → (the values that leave them off, why): given to
# another task they are refused in one line, never ignored. The command line lets any task take
# them (kotune.cli.open_dict_overrides), so that this line answers rather than Hydra's.
GUARDED_OPTIONS: dict[str, tuple[tuple, str]] = {
    "crf": ((None, False), "a CRF decodes sequences of tags: it needs a tagging task, task=ner or task=token_cls"),
    "long_text": ((None, "truncate"), f"documents become windows in sequence classification ({SEQUENCE_TASKS})"),
    "window_stride": ((None,), f"an option of task.long_text=windows ({SEQUENCE_TASKS})"),
    "window_pool": ((None,), f"an option of task.long_text=windows ({SEQUENCE_TASKS})"),
    "max_windows_per_batch": ((None,), f"an option of task.long_text=windows ({SEQUENCE_TASKS})"),
}


def build_task(task_cfg: DictConfig) -> Task:
    """The task object for a resolved ``cfg.task`` node: ``kind`` names the registered task a preset
    is (``task=dp_klue``: ``name: dp_klue``, ``kind: dp``), else its ``name`` does."""
    kind = task_cfg.get("kind") or task_cfg.get("name")
    if kind not in TASKS:
        raise ConfigError(f"unknown task '{kind}' (choices: {', '.join(sorted(TASKS))})")
    for option, (off, why) in GUARDED_OPTIONS.items():
        value = task_cfg.get(option)
        if option not in TASKS[kind].own_options and value not in off:
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"task.{option}={shown}: task {task_cfg.get('name')} has no such option ({why})")
    return TASKS[kind](OmegaConf.create(OmegaConf.to_container(task_cfg, resolve=True)))
