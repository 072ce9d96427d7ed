"""Gradient accumulation: one effective batch split into micro-batches (``train.grad_accum=k``,
``train.batch_size=B/k``) trains as the whole batch at once — the same train_loss, per-step loss,
gradient norm and gradients — in pretraining (mlm, mlm+nsp, rtd) and in fine-tuning (sequence, token,
span and dependency heads), the last, partial accumulation of an epoch included. The loss of a
step is the mean over the effective batch's labelled items (rows, labelled tokens, masked tokens,
pairs; rtd: masked and real tokens, each row's replacements drawn from its own seed), as one big batch gives it. Tiny sizes, no dropout (it would draw differently per split)."""
from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

import kotune.actions.pretrain
import kotune.training.pretraining
import kotune.training.trainer
from test_pretrain import TINY, corpus, documents_corpus

NO_DROPOUT = ["model.config_overrides.hidden_dropout_prob=0", "model.config_overrides.attention_probs_dropout_prob=0",
              "train.group_by_length=false", "train.logging_steps=1", "save_model=false"]
BATCH = 8


class Gradients(TrainerCallback):
    """Every optimizer step's gradient (after clipping), all parameters in one vector."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append(torch.cat([p.grad.detach().flatten().clone()
                                     for p in model.parameters() if p.grad is not None]))


@pytest.fixture
def recorded(monkeypatch) -> list:
    """The trainers the jobs build, each with its ``Gradients``."""
    trainers = []

    def recording(cls):
        class Recording(cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.gradients = Gradients()
                self.add_callback(self.gradients)
                trainers.append(self)

        return Recording

    monkeypatch.setattr(kotune.training.trainer, "KotuneTrainer", recording(kotune.training.trainer.KotuneTrainer))
    monkeypatch.setattr(kotune.actions.pretrain, "PretrainingTrainer", recording(kotune.training.pretraining.PretrainingTrainer))
    monkeypatch.setattr(kotune.actions.pretrain, "RTDTrainer", recording(kotune.training.pretraining.RTDTrainer))
    return trainers


def train_split(run_job, recorded, overrides: list[str], accum: int) -> tuple[dict, object]:
    """The job at effective batch ``BATCH`` in ``accum`` micro-batches: its results and trainer."""
    res = run_job(overrides + NO_DROPOUT + [f"train.batch_size={BATCH // accum}", f"train.grad_accum={accum}"],
                  f"accum{accum}")
    assert res["status"] == "ok", res.get("error")
    return res, recorded[-1]


def steps(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if "grad_norm" in h]


def assert_trains_as_one_batch(run_job, recorded, overrides: list[str], accums=(2,)) -> int:
    """grad_accum=k at batch BATCH/k against grad_accum=1 at BATCH: returns the rows per epoch."""
    whole, one = train_split(run_job, recorded, overrides, 1)
    rows = len(one.train_dataset)
    # the epoch's last optimizer step is partial: BATCH/2 rows and fewer
    assert BATCH // 2 < rows % BATCH < BATCH, rows
    for accum in accums:
        split, many = train_split(run_job, recorded, overrides, accum)
        assert many.state.global_step == one.state.global_step == -(-rows // BATCH)
        assert split["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-5)
        assert steps(many, "loss") == pytest.approx(steps(one, "loss"), rel=1e-5)
        assert steps(many, "grad_norm") == pytest.approx(steps(one, "grad_norm"), rel=1e-4)
        assert len(many.gradients.steps) == len(one.gradients.steps) == one.state.global_step
        for step, (a, b) in enumerate(zip(one.gradients.steps, many.gradients.steps), 1):
            assert (a - b).norm() <= 1e-4 * a.norm(), f"grad_accum={accum}, step {step}"
    return rows


@pytest.mark.parametrize("indexed", [False, True], ids=["cpu-picking", "gpu-index"])
@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "rtd"])
def test_pretraining_in_micro_batches_trains_as_one_batch(objective, indexed, tmp_path, run_job, recorded, monkeypatch):
    """Both ways a step picks the masked positions: boolean picking (the CPU's) and the fixed-shape
    index (``masked_positions``, a GPU's: no host wait)."""
    monkeypatch.setattr(kotune.actions.pretrain, "host_reads_wait", lambda: indexed)
    text = documents_corpus(tmp_path) if objective == "mlm+nsp" else corpus(tmp_path)
    electra = ["model.architecture=electra"] if objective == "rtd" else []
    overrides = TINY + electra + [f"data.train_file={text}", f"pretrain.objective={objective}", "train.epochs=1",
                        "pretrain.max_eval_blocks=2"]
    assert_trains_as_one_batch(run_job, recorded, overrides, accums=(2, 4))


FINE_TUNING = {  # a task per head kind, on its sample files; rows chosen for a partial last step
    "sequence": ["task=nli", "data.max_train_samples=22"],
    "token": ["task=token_cls", "data.max_train_samples=22"],
    "span": ["task=korquad", "data.max_train_samples=16", "task.max_length=128", "task.doc_stride=32"],
    "dependency": ["task=dp", "data.max_train_samples=14"],
    "token_crf": ["task=ner", "task.crf=true", "data.max_train_samples=22"],  # sentences' NLL over their slots
    "windows": ["task=text_cls", "task.long_text=windows", "train.max_length=8", "task.window_stride=2",
                "data.max_train_samples=22"],  # documents' losses, windows as many as they have
    "multi_label": ["task=multi_label", "task.threshold=0.5", "data.max_train_samples=22"],  # BCE over rows × labels (0.5: no tune slice out of the 22)
    "token_weighted": ["task=token_cls", "train.class_weights=balanced", "data.max_train_samples=22"],  # Σ w·loss / Σ w
}


@pytest.mark.parametrize("head", sorted(FINE_TUNING))
def test_fine_tuning_in_micro_batches_trains_as_one_batch(head, run_job, recorded):
    overrides = FINE_TUNING[head] + ["model=tiny", "data=sample", "train.epochs=1", "train.head_dropout=0",
                                     "save_predictions=false"]
    assert_trains_as_one_batch(run_job, recorded, overrides)
    if head == "token":  # the micro-batches held different numbers of labelled tokens
        trainer = recorded[-1]
        counts = {int((b["labels"] != -100).sum()) for b in trainer.get_train_dataloader()}
        assert len(counts) > 1
