"""``cfg.train`` → ``transformers.TrainingArguments`` (read by kotune/training/trainer.py's trainers and
``action=pretrain``): steps, batches, evaluation and checkpoint schedule, precision, loggers."""
from __future__ import annotations

import os
import sys

from omegaconf import DictConfig
from transformers import TrainingArguments

from kotune.training import early_stopping
from kotune.devices import cpu_only
from kotune.core.errors import ConfigError


def progress_bars_off() -> bool:
    """No progress bars where stderr is not a terminal and ``KOTUNE_PROGRESS=0`` (tests, benches, logs)."""
    return not sys.stderr.isatty() and os.environ.get("KOTUNE_PROGRESS", "1") == "0"


def plain_progress(trainer) -> None:
    """In a notebook without ipywidgets, the text progress bar instead of transformers' notebook one:
    tqdm (datasets, the Hub's downloads) falls back to text there, and the notebook callback's
    evaluation bar is left as an empty HTML output once it closes; one kind of bar throughout."""
    import importlib.util

    from transformers.trainer_callback import ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    notebook = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, NotebookProgressCallback)]
    if not notebook or importlib.util.find_spec("ipywidgets") is not None:
        return
    for cb in notebook:
        trainer.remove_callback(cb)
    trainer.add_callback(ProgressCallback)


def loggers(cfg: DictConfig) -> list[str]:
    """``train.report_to``: the Trainer integrations to log to (``none``: none)."""
    value = cfg.train.get("report_to") or "none"
    names = [str(value)] if isinstance(value, str) else [str(v) for v in value]
    return [n for n in names if n != "none"]


def tensorboard_dir(cfg: DictConfig, run_dir: str) -> str | None:
    """Where TensorBoard events go when ``train.report_to`` names it: ``<run dir>/tensorboard`` (the
    library's default, ./runs of the working directory, would mix every run's curves)."""
    if "tensorboard" not in loggers(cfg):
        return None
    import importlib.util

    if not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
        raise ConfigError('train.report_to=tensorboard needs the tensorboard package: pip install -e ".[tensorboard]"')
    return os.path.join(run_dir, "tensorboard")


def training_arguments(cfg: DictConfig, run_dir: str, label_names: list[str], do_eval: bool,
                       steps_per_epoch: int | None = None, main_metric: str | None = None,
                       greater_is_better: bool = True) -> TrainingArguments:
    """``cfg.train`` → ``TrainingArguments``. ``train.select_best`` (needs ``do_eval``) evaluates
    ``train.evals_per_epoch`` times per epoch and keeps the checkpoint with the best
    ``main_metric``; checkpoints otherwise follow ``train.save_strategy``."""
    t = cfg.train
    eval_strategy = str(t.eval_strategy) if do_eval else "no"
    save_strategy, save_steps, eval_steps, best = str(t.save_strategy), int(t.get("save_steps", 500)), None, {}
    if t.get("select_best"):
        if not do_eval:
            raise ConfigError("train.select_best=true needs a validation split to select on")
        evals = max(1, int(t.get("evals_per_epoch", 4)))
        eval_steps = max(1, (steps_per_epoch or 1) // evals)
        eval_strategy = save_strategy = "steps"
        save_steps = eval_steps
        best = {"load_best_model_at_end": True, "metric_for_best_model": main_metric,
                "greater_is_better": greater_is_better}
    return TrainingArguments(
        **runtime_arguments(cfg, run_dir, label_names),
        learning_rate=float(t.learning_rate),
        num_train_epochs=float(t.epochs),
        max_steps=int(t.max_steps),
        per_device_train_batch_size=int(t.batch_size),
        gradient_accumulation_steps=int(t.grad_accum),
        warmup_steps=float(t.warmup_ratio),  # < 1: a fraction of the total steps
        weight_decay=float(t.weight_decay),
        # AdamW's fused kernel (one launch for every parameter; CUDA, and the CPU's own): Trainer's default
        # since torch 2.8, pinned so that a change of that default does not change kotune's optimizer
        optim="adamw_torch_fused",
        eval_strategy=eval_strategy,
        eval_steps=eval_steps,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=t.get("save_total_limit"),
        **best,
        **early_stopping.training_arguments(cfg),  # train.early_stopping_patience: its counter resumes
        logging_steps=int(t.logging_steps),
        train_sampling_strategy="group_by_length" if t.group_by_length else "random",
        ddp_find_unused_parameters=bool(cfg.mode.frozen) or None,
    )


def prediction_arguments(cfg: DictConfig, run_dir: str, label_names: list[str]) -> TrainingArguments:
    """``TrainingArguments`` for a Trainer that only predicts (a checkpoint's eval and predict): how
    batches run (:func:`runtime_arguments`), none of training's schedule, optimizer or checkpoints."""
    return TrainingArguments(**runtime_arguments(cfg, run_dir, label_names))


def runtime_arguments(cfg: DictConfig, run_dir: str, label_names: list[str]) -> dict:
    """What every Trainer of a job shares, training or only predicting: where and in what precision
    batches run, the evaluation batch size, the data loaders, seed and determinism, compilation,
    loggers and progress bars."""
    import torch

    t = cfg.train
    precision = str(t.precision)
    if precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision must be fp32, bf16 or fp16, got '{precision}'")
    cuda = torch.cuda.is_available()
    if precision == "fp16" and not cuda:
        raise ConfigError("train.precision=fp16 needs a CUDA GPU (autocast with a loss scaler); "
                          "on CPU use bf16 or fp32")
    workers = dataloader_workers(t)
    return dict(
        output_dir=os.path.join(run_dir, "checkpoints"),
        per_device_eval_batch_size=int(t.eval_batch_size),
        seed=int(t.seed),
        # train.deterministic: torch's deterministic algorithms and cuBLAS's fixed workspace (bit-exact
        # reruns on one GPU, at some speed); the CPU's kernels are deterministic already
        full_determinism=bool(t.get("deterministic", False)),
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        torch_compile=bool(t.get("compile", False)),
        report_to=[n for n in loggers(cfg) if n != "tensorboard"] or "none",  # tensorboard: KotuneTrainer
        remove_unused_columns=False,  # features carry only model inputs; ids stay outside
        label_names=list(label_names),
        use_cpu=cpu_only(),
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,  # not re-forked for every evaluation
        dataloader_pin_memory=cuda,
        disable_tqdm=progress_bars_off(),
    )


def dataloader_workers(t: DictConfig) -> int:
    """``train.dataloader_num_workers``; ``auto``: 2 per process on CUDA (collation overlaps the
    GPU step), 0 on CPU, where a worker would take a core from the matmuls."""
    import torch

    value = t.get("dataloader_num_workers", "auto")
    if value in (None, "auto"):
        return min(2, os.cpu_count() or 1) if torch.cuda.is_available() else 0
    return int(value)
