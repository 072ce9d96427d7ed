"""A training step never makes the host wait on the device (no ``.item()``, no boolean indexing, no
tensor built from host values in the loss counts, the loss or the running loss sum, a pretraining
step included; libraries' own waits are listed in ``LIBRARY_WAITS``), and AdamW is the fused kernel. The CPU has no device to wait on, so the ops that would wait on a GPU are counted."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import ROOT, compose
from test_compile import train


class HostWaits(TorchDispatchMode):
    """Records the ops that make the host wait on a GPU: reading a value (``.item()``, ``float()``,
    ``bool()``: ``_local_scalar_dense``), sizes only the data gives (``nonzero``, boolean indexing,
    ``masked_select``, ``unique``) and tensors made from host values (``lift_fresh``: ``torch.tensor``,
    on a GPU a blocking copy). On the CPU they cost nothing, which is why they are counted, not timed."""

    WAITS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
             "aten::lift_fresh", "aten::equal"}
    MASKED = {"aten::index", "aten::index_put_", "aten::index_put"}

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.WAITS or (name in self.MASKED and any(  # x[mask], x[mask] = v: a nonzero inside
                torch.is_tensor(i) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ())):
            self.found.append(f"{name} ({caller()})")
        return func(*args, **(kwargs or {}))


def caller() -> str:
    """The innermost frame outside torch and this file: the code that asked for the op."""
    frame = sys._getframe(2)
    while frame is not None and (f"{os.sep}torch{os.sep}" in frame.f_code.co_filename
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def ours(found: list[str]) -> list[str]:
    """The waits asked for by the project's code (not the encoder's own: transformers' BERT reads
    ``padding_mask.all()`` once a forward to skip the attention mask of an unpadded batch)."""
    project = tuple(str(ROOT / package) + os.sep for package in ("kotune", "heads", "tasks"))  # not a venv inside the checkout
    return [f for f in found if f.split(" (", 1)[-1].startswith(project)]


# Waits asked for by libraries kotune calls, kept: why each stays.
LIBRARY_WAITS = {
    f"{os.sep}transformers{os.sep}masking_utils.py": "BERT reads padding_mask.all() once a forward to skip the "
                                                     "attention mask of an unpadded batch",
    f"{os.sep}torchcrf{os.sep}": "pytorch-crf (task.crf=true) checks mask[:, 0].all() in its forward and asserts it "
                                 "again in its score and its normalizer: the library's own, kotune's CRF asks no other",
}

def library(found: str) -> bool:
    return any(part in found for part in LIBRARY_WAITS)


def watched(waits: HostWaits, base: type | None = None):
    """A ``base`` (default KotuneTrainer) whose steps (counts, forward, loss, backward, the running
    loss sum) run under ``waits``."""
    from kotune.training.trainer import KotuneTrainer

    class Watched(base or KotuneTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            with waits:
                return super().training_step(model, inputs, num_items_in_batch)

        def _get_num_items_in_batch(self, batch_samples, device):
            with waits:
                return super()._get_num_items_in_batch(batch_samples, device)

    return Watched


@pytest.mark.parametrize("job", [
    [],                                                 # cross-entropy over rows
    ["task=text_cls", "train.class_weights=balanced"],  # weighted counts
    ["task=sts"],                                       # regression: counts from the shape
    ["task=multi_label"],                               # rows × labels
    ["task=ner"],                                       # tokens
    ["task=dp"],                                        # words: the dependency head's arcs and labels
    ["task=dp", "task.pos=true", "task.word_pooling=mean"],  # its POS features, mean-pooled words
    ["task=ner", "task.crf=true"],                      # the CRF's likelihood over label slots (torchcrf's own exempt)
    ["train.grad_accum=2"],                             # counts summed over micro-batches
])
def test_a_training_step_never_waits_on_the_device(job, cache_dir):
    waits = HostWaits()
    overrides = [*job, "train.max_steps=3"]
    _, loss = train(overrides, cache_dir, trainer_class=watched(waits))
    assert loss == loss  # trained, finite
    assert ours(waits.found) == [], f"a training step waits on the device: {sorted(set(ours(waits.found)))}"
    # nor anywhere else but the listed libraries (a backward's waits show at the backward call)
    assert [f for f in waits.found if not library(f)] == []
    forwards = 3 * int(dict(a.split("=") for a in overrides if "grad_accum" in a).get("train.grad_accum", 1))
    assert len([f for f in waits.found if "masking_utils" in f]) <= forwards  # the encoder's one a forward, no more


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "rtd"])
def test_a_pretraining_step_never_waits_on_the_device(objective, tmp_path, run_job, monkeypatch):
    """action=pretrain's steps (the masked-LM head at the masked positions, the RTD generator's
    sampling and filling, their gradients): the encoders' own waits, nothing else. The training
    batches carry the masked positions as a fixed-shape index (tasks/pretrain.py's ``masked_positions``)."""
    import kotune.actions.pretrain as action
    from test_pretrain import TINY, corpus, documents_corpus

    waits = HostWaits()
    for name in ("PretrainingTrainer", "RTDTrainer"):
        monkeypatch.setattr(action, name, watched(waits, getattr(action, name)))
    monkeypatch.setattr(action, "host_reads_wait", lambda: True)  # a GPU's way, watched on the CPU
    job = {"rtd": ["model.architecture=electra", "pretrain.objective=rtd"],
           "mlm+nsp": ["pretrain.objective=mlm+nsp"]}.get(objective, [])
    text = documents_corpus(tmp_path) if objective == "mlm+nsp" else corpus(tmp_path)
    res = run_job([*TINY, *job, f"data.train_file={text}", "train.max_steps=3", "save_model=false"])
    assert res["status"] == "ok", res.get("error")
    assert ours(waits.found) == [], f"a pretraining step waits on the device: {sorted(set(ours(waits.found)))}"
    # nor in the backward (a boolean picking's gradient, index_put, shows there) or anywhere but the libraries
    assert [f for f in waits.found if not library(f)] == []
    encoders = 2 if objective == "rtd" else 1  # the generator's and the discriminator's
    encoder_waits = len([f for f in waits.found if "masking_utils" in f])
    assert 3 <= encoder_waits <= 3 * encoders  # the watch saw the steps, and the encoders wait once a forward


def test_the_watch_sees_a_wait():
    waits = HostWaits()
    with waits:
        x = torch.arange(5)
        float(x.sum())
        x[x > 2].sum()
        torch.tensor([3])
    assert [f.split()[0] for f in waits.found] == ["aten::_local_scalar_dense", "aten::index", "aten::lift_fresh"]
    assert ours(waits.found) == []  # this file's own are not the project's


def test_adamw_is_fused_on_cuda_and_on_the_cpu(monkeypatch, tmp_path):
    """``optim="adamw_torch_fused"`` whatever the device (and whatever Trainer's default becomes)."""
    import kotune.training.arguments as ta

    cfg = compose(["task=text_cls", "model=tiny", "data=sample"])
    assert ta.training_arguments(cfg, str(tmp_path), ["labels"], False).optim == "adamw_torch_fused"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ta, "cpu_only", lambda: True)  # no CUDA device to place on here
    args = ta.training_arguments(cfg, str(tmp_path), ["labels"], False)
    assert args.optim == "adamw_torch_fused"
