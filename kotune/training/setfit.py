"""``mode=setfit``: few-shot classification as SetFit (Tunstall et al. 2022) does it, on kotune's encoder.

1. The contrastive stage: the encoder, as a sentence-transformers model (heads/model/sentence_transformer.py:
   shared, not copied), trains on pairs drawn from the labelled training rows (same class → similar, other
   class → not), with the ``setfit`` package's own pair sampling (``num_iterations``: ``mode.pairs_per_example``),
   loss (``CosineSimilarityLoss``, passed explicitly) and trainer (``setfit.Trainer.train_embeddings``, on
   sentence-transformers' trainer).
2. The head: the encoder is then fixed and SetFit's differentiable head, one linear layer (the sequence
   head's ``linear`` shape, kotune/loading/build.py), trains on its pooled embedding (``mode.pooling``, mean by
   default, the embedding stage 1 trained) through transformers' Trainer, as in ``mode=frozen``, at
   setfit's head rate and L2 weight (``mode.learning_rate`` 1e-2: train.learning_rate's default;
   train.weight_decay 0.01) — rather than setfit's default scikit-learn logistic regression, so that
   the run is an ordinary kotune run: eval, predict, serve.

The saved checkpoint is a frozen-encoder model (``kotune.json`` mode ``frozen``, with its pooling).
"""
from __future__ import annotations

import shutil
import tempfile
import time

from omegaconf import DictConfig

from kotune.core.errors import ConfigError
from kotune.core.log import log, quieted


def refusal(task) -> str | None:
    """Why a task cannot train in mode=setfit (one line's end), None when it can: single-text,
    single-label classification on the sequence head."""
    if task.head != "sequence" or getattr(task, "request_fields", None) != ("text",):
        return "is not single-text classification: SetFit trains an embedding of one text per row"
    if getattr(task, "regression", False) or task.cfg.get("multi_label"):
        return "has no single class per row to draw same-class and other-class pairs from"
    if getattr(task, "windows", None) is not None:
        return "reads documents as windows (task.long_text=windows): an embedding is one window"
    return None


def check(cfg: DictConfig, task) -> None:
    why = refusal(task)
    if why:
        raise ConfigError(f"mode=setfit: task {task.name} {why}")
    if cfg.get("checkpoint"):
        raise ConfigError("mode=setfit trains a fresh head after its contrastive stage: no checkpoint= "
                          "(model.name_or_path=DIR starts from another encoder)")


def train_body(cfg: DictConfig, b) -> dict:
    """The contrastive stage on ``b``'s training split; the encoder is left fixed (eval mode, no
    gradients) for the head. Returns results.json's ``setfit`` entry."""
    import setfit
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    from setfit import SetFitModel, Trainer, TrainingArguments

    from heads.model.sentence_transformer import build_sentence_transformer
    from kotune.devices import quiet_libraries

    quiet_libraries()  # importing setfit turns transformers' log up to info

    check(cfg, b.task)
    examples = b.splits["train"].examples
    labels = [b.task.labels.index(ex["label"]) for ex in examples]
    if len(set(labels)) < 2:
        raise ConfigError(f"mode=setfit: the training split ({b.splits['train'].where}) has one class; "
                          "pairs of different classes need two")
    m = cfg.mode
    encoder = b.model.encoder
    body = build_sentence_transformer(encoder, b.tokenizer, layers=m.get("layers", "last"), pooling=m.get("pooling"),
                                      max_length=b.max_length)
    scratch = tempfile.mkdtemp(prefix="kotune-setfit-")  # setfit's Trainer wants an output folder; it saves nothing there
    args = TrainingArguments(output_dir=scratch, batch_size=int(m.body_batch_size),
                             num_epochs=int(m.body_epochs), num_iterations=int(m.pairs_per_example),
                             body_learning_rate=float(m.body_learning_rate), seed=int(cfg.train.seed),
                             report_to="none", save_strategy="no", show_progress_bar=False, loss=CosineSimilarityLoss)
    # sentence-transformers' trainer, built before setfit hands it the loss above, notes the default it
    # would use (CoSENT) at info level: quieted, with setfit's own "Running training" block
    with quieted("sentence_transformers", "setfit"):
        trainer = Trainer(model=SetFitModel(model_body=body), args=args)
    quiet(trainer.st_trainer)
    log(f"mode=setfit: the contrastive stage on {len(examples)} rows ({m.pairs_per_example} × 2 pairs each, "
        f"setfit {setfit.__version__})")
    encoder.requires_grad_(True)
    started = time.time()
    try:
        with quieted("setfit"):
            trainer.train_embeddings([ex["text"] for ex in examples], labels)
    finally:
        encoder.requires_grad_(False)  # the head trains on a fixed encoder, as in mode=frozen
        encoder.eval()
        shutil.rmtree(scratch, ignore_errors=True)
    state = trainer.st_trainer.state
    loss = next((h["train_loss"] for h in reversed(state.log_history) if "train_loss" in h), None)
    report = {"package": f"setfit {setfit.__version__}", "pairs": len(trainer.st_trainer.train_dataset),
              "steps": int(state.global_step), "loss": loss, "seconds": round(time.time() - started, 2)}
    log(f"mode=setfit: {report['pairs']} pairs, {report['steps']} steps, loss {loss}")
    return report


def quiet(st_trainer) -> None:
    """sentence-transformers' trainer as kotune's runs its own: progress bars only where kotune shows them,
    no pinned memory without a GPU (a warning per epoch)."""
    import torch
    from transformers.trainer_callback import ProgressCallback

    from kotune.training.arguments import plain_progress, progress_bars_off

    plain_progress(st_trainer)
    if progress_bars_off():
        st_trainer.pop_callback(ProgressCallback)
    st_trainer.args.dataloader_pin_memory = torch.cuda.is_available()
