"""The actions, by name: ``python run.py action=NAME`` calls ``ACTIONS[NAME](cfg, run_dir) -> dict``
(the results body), which runs ``kotune/actions/NAME.py``'s ``run``. A new action is one file here
plus one line below.

Each entry imports its module when called, so that the command line answers a config mistake
before torch and transformers load (seconds), and a job imports only the action it runs."""
from __future__ import annotations

import importlib
from typing import Callable

from omegaconf import DictConfig

Action = Callable[[DictConfig, str], dict]


def _module_action(module: str) -> Action:
    def run(cfg: DictConfig, run_dir: str) -> dict:
        return importlib.import_module(module).run(cfg, run_dir)

    run.__qualname__ = run.__name__ = f"{module}.run"
    return run


ACTIONS: dict[str, Action] = {
    "train": _module_action("kotune.actions.train"),
    "eval": _module_action("kotune.actions.eval"),
    "predict": _module_action("kotune.actions.predict"),
    "ceiling": _module_action("kotune.actions.ceiling"),
    "embed": _module_action("kotune.actions.embed"),
    "pretrain": _module_action("kotune.actions.pretrain"),
    "score": _module_action("kotune.actions.score"),
    "export": _module_action("kotune.actions.export"),
    "probe": _module_action("kotune.actions.probe"),
    "serve": _module_action("kotune.actions.serve"),
    "label_issues": _module_action("kotune.actions.label_issues"),
    "distill": _module_action("kotune.actions.distill"),
    "rerank": _module_action("kotune.actions.rerank"),
}
