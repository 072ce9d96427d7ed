"""``action=train``: fine-tune the task's head (and the encoder, unless ``mode=frozen``) on the
train split, predict the validation split with the final (or, with ``train.select_best``, the
best) weights, write the model."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.calibration import fit as calibration

from kotune.training import early_stopping
from kotune.loading.build import build
from kotune.devices import local_rank_zero_first
from kotune.core.errors import ConfigError
from tasks.folds import SELECTIONS
from kotune.core.log import log


def selected_on(cfg: DictConfig) -> str | None:
    """Where ``train.select_best`` picks the checkpoint (results.json ``selected_on``): the
    validation split, a cross-validation run's validation fold (the one it reports: an optimistic
    score), or a slice of the training folds (``data.fold_selection=inner``); None without selection."""
    from tasks.folds import fold_selection

    selection = fold_selection(cfg.data)
    if selection == "inner" and not cfg.train.get("select_best"):
        raise ConfigError("data.fold_selection=inner holds out a slice of the training folds to select the checkpoint "
                          "on: it needs train.select_best=true")
    if not cfg.train.get("select_best"):
        return None
    return SELECTIONS[selection] if cfg.data.get("folds") is not None else "validation split"


def run(cfg: DictConfig, run_dir: str, distillation=None) -> dict:
    """``distillation`` (kotune/distill/distillation.py, action=distill): the student's encoder, the teacher's
    cached logits on the training rows and the distillation loss; the rest is this training run."""
    selection = selected_on(cfg)
    if cfg.mode.get("setfit"):  # a task it cannot train: one line before anything is read or built
        from kotune.training import setfit
        from tasks import build_task

        setfit.check(cfg, build_task(cfg.task))
    need = ("train", "validation", "select") if selection == SELECTIONS["inner"] else ("train", "validation")
    with local_rank_zero_first():
        b = build(cfg, need + (("calibrate",) if calibration.method(cfg) else ()),
                  encoder_side=distillation.encoder_side(cfg) if distillation else None,
                  calibrate_share=calibration.fraction(cfg))
        if distillation:
            distillation.prepare(cfg, b)
    calibration.check(cfg, b.model, b.splits)  # a head without class probabilities, a slice too small: before training
    # after build: a data or config mistake is answered before transformers' Trainer (and peft,
    # accelerate) load, seconds of every failing command
    from kotune.sweeps import pruning
    from kotune.inference.predict import fit_decision, predict, run_report
    from kotune.training.resume import train_resumable
    from kotune.training.trainer import make_trainer

    trainer_class = None
    if distillation:
        from kotune.distill.trainer import DistillTrainer as trainer_class
    contrastive = setfit.train_body(cfg, b) if cfg.mode.get("setfit") else None  # mode=setfit's first stage
    trainer = make_trainer(cfg, b, run_dir, fit_decision=lambda t: fit_decision(t, b), trainer_class=trainer_class)
    if distillation:
        trainer.use(distillation.loss())
    log(f"training: {len(b.splits['train'].examples)} examples, "
        f"{b.model.param_counts()['trainable_params']:,} trainable parameters")
    train_metrics, train_loss, resumed_from = train_resumable(trainer, cfg, run_dir)
    best = {}
    if cfg.train.get("select_best"):
        last = [h for h in trainer.state.log_history if f"eval_{b.task.main_metric}" in h]
        best = {"best_step": trainer.state.best_global_step,
                "metrics_last": {k[5:]: v for k, v in last[-1].items()
                                 if k.startswith("eval_") and isinstance(v, (int, float))
                                 and k[5:] not in ("loss", "runtime", "samples_per_second", "steps_per_second")}
                if last else None}
    fit_decision(trainer, b)
    calibrated = calibration.calibrate(cfg, trainer, b, run_dir)  # folded into the head before it predicts
    if calibrated:
        b.model.meta.setdefault("task_options", {}).update(b.task.fitted_options())  # thresholds moved with it
    log("evaluating")
    outputs, speed = predict(trainer, b, "validation")
    res = run_report(cfg, run_dir, b, "validation", outputs, speed, train_loss=train_loss,
                     train_samples_per_second=train_metrics.get("train_samples_per_second"),
                     head_train_s=train_metrics.get("train_runtime"),
                     resumed_from=resumed_from, early_stopping=early_stopping.report(trainer, cfg),
                     pruned=pruning.report(trainer), selected_on=selection, calibration=calibrated, setfit=contrastive,
                     distill=distillation.results(cfg, b, "validation") if distillation else None, **best)
    if res["pruned"]:
        log(f"pruned at evaluation {res['pruned']['evaluation']} (step {res['pruned']['step']} of "
            f"{res['pruned']['max_steps']}): no model saved")
    elif trainer.is_world_process_zero() and cfg.save_model:
        b.model.save(os.path.join(run_dir, "model"), b.tokenizer)
    return res
