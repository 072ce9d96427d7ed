"""``train.batch_tokens``: training batches filled to a token budget. The cut keeps every padded
batch within the budget, every row is trained on once an epoch, the count of batches is the same
every epoch (Trainer's schedule and resume rely on it), the order is seeded, processes get disjoint
equal shares; a run with it trains, and a run resumed from one of its checkpoints ends where the
uninterrupted one does."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from kotune.training.token_budget import TokenBudgetBatches

RNG = np.random.default_rng(0)
SIZES = [(1, int(n)) for n in RNG.integers(3, 60, size=203)]


def padded(batch: list[int], multiple: int = 8) -> int:
    longest = max(SIZES[i][1] for i in batch)
    return len(batch) * -(-longest // multiple) * multiple


def test_batches_keep_the_budget_and_cover_every_row_once_an_epoch():
    sampler = TokenBudgetBatches(SIZES, 256, seed=3, multiple=8)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(SIZES)))
        assert all(padded(b) <= 256 or len(b) == 1 for b in batches)
        # full use of the budget: no two neighbouring batches of one length class could have merged
        assert sum(len(b) for b in batches) / len(batches) > 4


def test_the_order_is_seeded_and_changes_with_the_epoch():
    a, b = TokenBudgetBatches(SIZES, 256, seed=3, multiple=8), TokenBudgetBatches(SIZES, 256, seed=3, multiple=8)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    assert list(TokenBudgetBatches(SIZES, 256, seed=4, multiple=8)) != list(a)


def test_processes_get_disjoint_equal_shares():
    shares = [TokenBudgetBatches(SIZES, 256, seed=3, multiple=8, world=3, rank=r) for r in range(3)]
    lists = [list(s) for s in shares]
    assert len({len(x) for x in lists}) == 1 and all(len(x) == len(s) for x, s in zip(lists, shares))
    rows = [i for x in lists for b in x for i in b]
    assert len(rows) == len(set(rows))


def test_a_row_longer_than_the_budget_trains_alone():
    sampler = TokenBudgetBatches([(1, 300), (1, 5), (1, 5)], 64, seed=0)
    assert sorted(map(sorted, sampler)) == [[0], [1, 2]]


def test_a_run_with_batch_tokens_trains_and_resumes_exactly(run_job, tmp_path):
    job = ["task=text_cls", "model=tiny", "data=sample", "train.batch_tokens=256", "train.max_steps=6",
           "train.save_strategy=steps", "train.save_steps=2", "train.save_total_limit=null", "train.logging_steps=1"]
    whole = run_job(job, "whole")
    assert whole["status"] == "ok", whole.get("error")
    state = json.loads((tmp_path / "whole" / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert state["epoch"] != pytest.approx(6 / 3)  # 80 sample rows in 32-row batches: 3 steps an epoch
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "whole", cut, ignore=shutil.ignore_patterns("results.json", "predictions*", "model"))
    for step in (4, 6):
        shutil.rmtree(cut / "checkpoints" / f"checkpoint-{step}")
    again = run_job(job, "cut")
    assert again["status"] == "ok" and again["resumed_from"] == 2
    assert again["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-5)
    assert again["metrics"] == pytest.approx(whole["metrics"], abs=1e-6)


def test_deterministic_training_sets_torchs_full_determinism(tmp_path, monkeypatch):
    """``train.deterministic=true`` → Trainer's ``full_determinism`` (torch's deterministic algorithms,
    cuBLAS's fixed workspace); off by default, where it costs GPU speed."""
    from conftest import compose
    from kotune.training.arguments import training_arguments

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # Trainer's enable_full_determinism sets it
    base = ["task=text_cls", "model=tiny", "data=sample"]
    assert not training_arguments(compose(base), str(tmp_path), ["labels"], False).full_determinism
    assert training_arguments(compose([*base, "train.deterministic=true"]), str(tmp_path), ["labels"],
                              False).full_determinism
