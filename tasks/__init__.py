"""Task registry: name → task class. The task's config (conf/task/<name>.yaml) holds its
explicit column map, label names, hub dataset and main metric."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from tasks.base import Task
from tasks.classification import ClassificationTask
from tasks.errors import ConfigError
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


def build_task(task_cfg: DictConfig) -> Task:
    """The task object for a resolved ``cfg.task`` node: ``kind`` names the registered task a preset
    is (``task=dp_klue``: ``name: dp_klue``, ``kind: dp``), else its ``name`` does."""
    kind = task_cfg.get("kind") or task_cfg.get("name")
    if kind not in TASKS:
        raise ConfigError(f"unknown task '{kind}' (choices: {', '.join(sorted(TASKS))})")
    return TASKS[kind](OmegaConf.create(OmegaConf.to_container(task_cfg, resolve=True)))
