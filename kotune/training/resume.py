"""Interrupted runs resume: the completion marker a checkpoint ends with, the config a checkpoint
must match, the newest complete checkpoint of a run directory, and ``train()`` continued from it
with the train loss over all steps."""
from __future__ import annotations

import json
import math
import os

from omegaconf import DictConfig, OmegaConf

from kotune.core.errors import ConfigError, KotuneError
from kotune.core.log import log

COMPLETE = "kotune_complete.json"  # written last into a checkpoint: its absence marks a cut-short save
# keys that do not change what training computes: another value still resumes
RESUME_IGNORES = ("train.resume", "train.logging_steps", "train.save_strategy", "train.save_steps",
                  "task.max_windows_per_batch",
                  "train.save_total_limit", "train.eval_batch_size", "train.dataloader_num_workers", "cache_dir",
                  "save_model", "save_predictions", "keep_going_on_bugs")


def resume_identity(cfg: DictConfig) -> dict:
    """The resolved config that a checkpoint must match to be resumed from, flattened."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix[:-1]] = node

    walk(plain, "")
    return {k: v for k, v in flat.items() if not k.startswith(RESUME_IGNORES)}


def find_resume_checkpoint(cfg: DictConfig, run_dir: str) -> tuple[str | None, dict]:
    """``train.resume``: auto → the newest complete ``checkpoints/checkpoint-N`` of this run
    directory (a save cut short by a kill is skipped with a warning); never; or a PATH."""
    mode = str(cfg.train.get("resume", "auto"))
    if mode == "never":
        return None, {}
    if mode != "auto":
        if not os.path.exists(os.path.join(mode, COMPLETE)):
            raise ConfigError(f"train.resume={mode}: not a complete kotune checkpoint (no {COMPLETE})")
        candidates = [mode]
    else:
        root = os.path.join(run_dir, "checkpoints")
        names = os.listdir(root) if os.path.isdir(root) else []
        steps = sorted((int(n.split("-")[1]) for n in names if n.startswith("checkpoint-") and n.split("-")[1].isdigit()),
                       reverse=True)
        candidates = [os.path.join(root, f"checkpoint-{s}") for s in steps]
    for path in candidates:
        try:
            with open(os.path.join(path, COMPLETE), encoding="utf-8") as f:
                marker = json.load(f)
        except (OSError, ValueError):
            log(f"warning: {path} is incomplete (cut short while saving?): skipped")
            continue
        saved, now = marker.get("config") or {}, resume_identity(cfg)
        differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if differ:
            shown = ", ".join(f"{k} ({saved.get(k)!r} → {now.get(k)!r})" for k in differ[:5])
            raise ConfigError(f"cannot resume from {path}: the config differs in {shown}"
                              f"{' …' if len(differ) > 5 else ''}; use train.resume=never to start over "
                              "(or another hydra.run.dir)")
        return path, marker
    return None, {}


def restore_finished(trainer, checkpoint: str) -> None:
    """The end of a finished training from its last checkpoint: Trainer's state (best step and
    metric, log history) and the weights it ended with — the best checkpoint's where
    ``load_best_model_at_end`` (``train.select_best``)."""
    from transformers import TrainerState

    trainer.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    best = trainer.best_checkpoint_dir()
    if trainer.args.load_best_model_at_end and best:
        if not os.path.isdir(best):
            raise KotuneError(f"{checkpoint}: training had finished, but its best checkpoint {best} is gone; "
                              "use train.resume=never to train again")
        trainer._load_best_model()
    else:
        trainer._load_from_checkpoint(checkpoint)


def train_resumable(trainer, cfg: DictConfig, run_dir: str) -> tuple[dict, float | None, int | None]:
    """``trainer.train()``, continued from the run dir's newest complete checkpoint (``train.resume``):
    returns Trainer's metrics, the train loss over *all* steps (Trainer's own averages only the steps
    after a resume) and the step resumed from."""
    resume_from, marker = find_resume_checkpoint(cfg, run_dir)
    total = None
    if resume_from:
        with open(os.path.join(resume_from, "trainer_state.json"), encoding="utf-8") as f:
            total = json.load(f).get("max_steps")
        log(f"resume: from {os.path.basename(resume_from)} of {total}")
    if resume_from and (marker.get("stopped") or (total and int(marker["step"]) >= int(total))):
        # training had finished — all its steps, or stopped early (Trainer would run on when resumed
        # there): the model it ended with, and its state (best step, evaluation history)
        restore_finished(trainer, resume_from)
        train_metrics, train_loss = {}, marker["loss_sum"] / int(marker["step"])
    else:
        trainer.loss_sum_before = float(marker["loss_sum"]) if resume_from else 0.0
        train_metrics = trainer.train(resume_from_checkpoint=resume_from).metrics
        # kotune's own sum over all steps: Trainer's train_loss after a resume averages over all
        # steps in some releases and over this call's in others
        steps = trainer.state.global_step
        train_loss = trainer.loss_sum() / steps if steps else train_metrics.get("train_loss")
        if train_loss is not None:
            train_metrics["train_loss"] = train_loss
    if not math.isfinite(train_loss if train_loss is not None else 0.0):
        raise KotuneError(f"training diverged: loss is {train_loss}")
    return train_metrics, train_loss, int(marker["step"]) if resume_from else None
