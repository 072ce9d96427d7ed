"""``train.compile`` compiles one graph for every batch shape, not one per shape (kotune/training/compiled.py),
and trains to eager's loss."""
from __future__ import annotations

import tempfile

import pytest
import torch

from conftest import compose

# tiny NLI on the shipped sample rows: 81 rows in batches of 8, so every epoch ends on a batch of one row
JOB = ["task=nli", "model=tiny", "data=sample", "train.batch_size=8", "train.logging_steps=100000",
       "save_model=false", "save_predictions=false"]
SMALL = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
         "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]
NO_DROPOUT = ["model.config_overrides.hidden_dropout_prob=0", "model.config_overrides.attention_probs_dropout_prob=0",
              "train.head_dropout=0"]


@pytest.fixture
def fresh_dynamo():
    """Compiled graphs, counters and the recompile cap as they were: nothing leaks into other tests."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.config.recompile_limit = limit


def train(overrides: list[str], cache_dir: str, backend: str | None = None, dynamic: bool = True,
          trainer_class=None):
    """One in-process training of ``JOB`` + ``overrides``; the trainer and its train_loss."""
    import kotune.training.trainer as kt
    from kotune.loading.build import build
    from kotune.devices import quiet_libraries

    quiet_libraries()
    cfg = compose([*JOB, *overrides, f"cache_dir={cache_dir}"])
    make_args = kt.training_arguments

    def with_backend(*a, **k):
        args = make_args(*a, **k)
        if backend:
            args.torch_compile_backend = backend
        return args

    base = trainer_class or kt.KotuneTrainer
    trainer_class = type("Compiled", (base,), {"compile_dynamic": dynamic})
    kt.training_arguments = with_backend
    try:
        trainer = kt.make_trainer(cfg, build(cfg, ("train",)), tempfile.mkdtemp(), trainer_class=trainer_class)
    finally:
        kt.training_arguments = make_args
    return trainer, float(trainer.train().metrics["train_loss"])


def test_compile_marks_the_batch_shapes_symbolic_and_compiles_once_per_kind_of_batch(cache_dir, fresh_dynamo):
    """12 steps cross several padded lengths (26, 20, …) and the epoch's last batch of one row: dynamo's
    own rule compiles 3 graphs (the first batch's shapes, symbolic ones, the one-row batch), kotune's 2;
    the loss is eager's (aot_eager: dynamo's tracing and graphs without inductor's kernels, which
    test_inductor_loss_matches_eager checks)."""
    from kotune.training import compiled

    _, eager = train(["train.max_steps=12", *SMALL], cache_dir)
    _, dynamo_rule = train(["train.max_steps=12", "train.compile=true", *SMALL], cache_dir, "aot_eager", dynamic=False)
    assert compiled.compilations() == 3
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    trainer, marked = train(["train.max_steps=12", "train.compile=true", *SMALL], cache_dir, "aot_eager")
    assert compiled.compilations() == 2
    assert torch._dynamo.config.recompile_limit <= compiled.RECOMPILE_LIMIT
    assert any(isinstance(cb, compiled.CompileReport) for cb in trainer.callback_handler.callbacks)
    assert dynamo_rule == pytest.approx(eager, abs=1e-6) and marked == pytest.approx(eager, abs=1e-6)


def test_marks_cover_rows_and_padded_length_only():
    from kotune.training import compiled

    batch = {"input_ids": torch.ones(4, 12, dtype=torch.long), "attention_mask": torch.ones(4, 12, dtype=torch.long),
             "labels": torch.zeros(4, dtype=torch.long), "multi": torch.zeros(4, 5)}
    compiled.mark_dynamic(batch)
    assert batch["input_ids"]._dynamo_weak_dynamic_indices == {0, 1}
    assert batch["labels"]._dynamo_weak_dynamic_indices == {0}
    assert batch["multi"]._dynamo_weak_dynamic_indices == {0}  # 5 labels, not the padded length
    plain = {"layer_states": torch.zeros(4, 12, 1, 8)}  # no token columns: dynamo's own rule
    compiled.mark_dynamic(plain)
    assert not hasattr(plain["layer_states"], "_dynamo_weak_dynamic_indices")


@pytest.mark.slow
def test_inductor_loss_matches_eager(cache_dir, fresh_dynamo):
    """inductor's kernels against eager on 8 steps of full batches (one graph; dropout off: inductor
    draws its own masks). Measured: equal to the last printed digit (1.111696720 both, 40 steps with
    the one-row batches: bench/compile_speed.py); the tolerance leaves float reassociation room."""
    from kotune.training import compiled

    _, eager = train(["train.max_steps=8", *NO_DROPOUT], cache_dir)
    _, inductor = train(["train.max_steps=8", "train.compile=true", *NO_DROPOUT], cache_dir)
    assert compiled.compilations() == 1
    assert inductor == pytest.approx(eager, rel=1e-5)


def test_compiled_padding_free_trains_to_the_padded_eager_loss(cache_dir, fresh_dynamo):
    """train.compile × model.padding_free: packing's sizes depend on the batch's data (dynamo breaks its
    graph there), and the loss is still the padded eager run's (aot_eager: dynamo's graphs)."""
    from test_padding_free import older_transformers

    if older_transformers():
        pytest.skip("transformers<5.25: model.padding_free is refused (tests/test_padding_free.py)")
    _, eager = train(["train.max_steps=4", *SMALL, *NO_DROPOUT], cache_dir)
    _, packed = train(["train.max_steps=4", "train.compile=true", "model.padding_free=true", *SMALL, *NO_DROPOUT],
                      cache_dir, "aot_eager")
    assert packed == pytest.approx(eager, abs=1e-6)


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_compiled_pretraining_on_the_gpus_masked_position_index_trains_to_the_eager_loss(objective, tmp_path, run_job,
                                                                                        fresh_dynamo, monkeypatch):
    """train.compile × action=pretrain's fixed-shape masked-position index (where a host read waits, a
    GPU: kotune.devices.host_reads_wait), watched on the CPU: compiled (aot_eager: dynamo's graphs),
    the index trains to the eager run's loss with the CPU's boolean picking (dropout off)."""
    import kotune.actions.pretrain as pretrain_action
    from kotune.training import compiled as compilation
    from test_pretrain import TINY, corpus

    make_args = pretrain_action.training_arguments

    def aot_eager(*args, **kwargs):
        made = make_args(*args, **kwargs)
        if made.torch_compile:
            made.torch_compile_backend = "aot_eager"
        return made

    monkeypatch.setattr(pretrain_action, "training_arguments", aot_eager)
    electra = ["model.architecture=electra"] if objective == "rtd" else []
    job = [*TINY, *electra, f"data.train_file={corpus(tmp_path)}", f"pretrain.objective={objective}",
           "train.max_steps=4", "model.config_overrides.hidden_dropout_prob=0",
           "model.config_overrides.attention_probs_dropout_prob=0"]
    monkeypatch.setattr(pretrain_action, "host_reads_wait", lambda: False)
    eager = run_job(job, "eager")
    assert compilation.compilations() == 0
    monkeypatch.setattr(pretrain_action, "host_reads_wait", lambda: True)
    compiled = run_job([*job, "train.compile=true"], "compiled")
    assert compilation.compilations() >= 1  # dynamo compiled the step's model
    assert eager["status"] == compiled["status"] == "ok", compiled.get("error")
    assert compiled["train_steps"] == eager["train_steps"] == 4
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-5)
