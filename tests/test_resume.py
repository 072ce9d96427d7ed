"""Interrupted runs resume where they stopped: a run killed (SIGKILL) after a checkpoint, run
again with the same command, continues from that checkpoint and ends exactly where an
uninterrupted run ends; a save cut short is skipped; a changed config refuses to resume."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli_here

STEPS = 40


def arguments(run_dir: Path, cache: str, *extra: str) -> list[str]:
    return ["task=nli", "model=tiny", "data=sample", f"cache_dir={cache}", f"train.max_steps={STEPS}",
            "train.batch_size=8", "train.save_strategy=steps", "train.save_steps=5", "train.save_total_limit=3",
            "train.logging_steps=5", f"hydra.run.dir={run_dir}", *extra]


def run(run_dir: Path, cache: str, *extra: str) -> subprocess.CompletedProcess:
    """The command in this process (conftest.run_cli_here): only the run that is killed needs one of its own."""
    return run_cli_here(arguments(run_dir, cache, *extra))


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.slow
def test_killed_run_resumes_and_matches_an_uninterrupted_one(tmp_path, cache_dir):
    reference = run(tmp_path / "ref", cache_dir)
    assert reference.returncode == 0, reference.stderr[-2000:]
    ref = results(tmp_path / "ref")

    run_dir = tmp_path / "killed"
    env = dict(os.environ, KOTUNE_PROGRESS="0")
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *arguments(run_dir, cache_dir)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if list((run_dir / "checkpoints").glob("checkpoint-*/kotune_complete.json")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before a checkpoint could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "results.json").exists()  # written once, atomically, when the job ends
    complete = sorted(int(p.parent.name.split("-")[1])
                      for p in (run_dir / "checkpoints").glob("checkpoint-*/kotune_complete.json"))
    # a save cut short by the kill: a newer checkpoint without its completion marker
    partial = run_dir / "checkpoints" / f"checkpoint-{STEPS - 1}"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"\0" * 100)

    again = run(run_dir, cache_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"checkpoint-{STEPS - 1} is incomplete" in again.stdout
    assert f"resume: from checkpoint-{complete[-1]} of {STEPS}" in again.stdout
    res = results(run_dir)
    assert res["resumed_from"] == complete[-1] > 0
    assert res["train_loss"] == pytest.approx(ref["train_loss"], abs=1e-6)
    assert res["metrics"] == pytest.approx(ref["metrics"], abs=1e-6)

    changed = run(run_dir, cache_dir, "train.learning_rate=1e-3")
    assert changed.returncode == 1
    assert "train.learning_rate" in changed.stderr and "train.resume=never" in changed.stderr
    fresh = run(run_dir, cache_dir, "train.learning_rate=1e-3", "train.resume=never")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert results(run_dir)["resumed_from"] is None


def test_frozen_checkpoints_hold_the_head_and_resume_on_the_cache(run_job, tmp_path):
    import torch
    from safetensors.torch import load_file

    job = ["task=nli", "model=tiny", "data=sample", "mode=frozen", "train.max_steps=4", "train.save_strategy=steps",
           "train.save_steps=2"]
    first = run_job(job, "job")
    assert first["status"] == "ok", first.get("error")
    saved = load_file(str(tmp_path / "job" / "checkpoints" / "checkpoint-4" / "model.safetensors"))
    head = load_file(str(tmp_path / "job" / "model" / "head.safetensors"))  # the trained head, as saved
    assert set(saved) == {f"head.{k}" for k in head}  # the head's weights and nothing of the encoder
    assert all(torch.equal(saved[f"head.{k}"], v) for k, v in head.items())
    again = run_job(job, "job")  # the same run dir: resumes from checkpoint-4, nothing left to train
    assert again["status"] == "ok", again.get("error")
    assert again["resumed_from"] == 4 and again["cache"]["status"] == "hit"
    assert again["metrics"] == pytest.approx(first["metrics"])
    assert again["train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)


def _cut_after(run_dir: Path, dst: Path, step: int) -> Path:
    """A copy of ``run_dir`` as a kill after checkpoint ``step`` leaves it: no results, no later checkpoints."""
    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("results.json", "predictions*", "model"))
    for ckpt in (dst / "checkpoints").glob("checkpoint-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    return dst


def test_a_run_resumed_twice_reports_the_uninterrupted_train_loss(run_job, tmp_path):
    """The second resume reads a checkpoint written *after* the first one: its marker's loss sum
    must cover every step since step 0, not only the steps of the call that saved it (the train loss
    is kotune's own sum, whatever Trainer's private accumulators hold in a given release)."""
    job = ["task=text_cls", "model=tiny", "data=sample", "train.max_steps=6", "train.batch_size=8",
           "train.save_strategy=steps", "train.save_steps=2", "train.save_total_limit=null", "train.logging_steps=1"]
    whole = run_job(job, "whole")
    assert whole["status"] == "ok", whole.get("error")
    markers = [json.loads((tmp_path / "whole" / "checkpoints" / f"checkpoint-{s}" / "kotune_complete.json").read_text())
               for s in (2, 4, 6)]
    assert markers[0]["loss_sum"] < markers[1]["loss_sum"] < markers[2]["loss_sum"]
    assert whole["train_loss"] == pytest.approx(markers[2]["loss_sum"] / 6, rel=1e-6)

    _cut_after(tmp_path / "whole", tmp_path / "once", 2)
    once = run_job(job, "once")
    assert once["status"] == "ok" and once["resumed_from"] == 2
    again = _cut_after(tmp_path / "once", tmp_path / "twice", 4)
    marker = json.loads((again / "checkpoints" / "checkpoint-4" / "kotune_complete.json").read_text())
    assert marker["loss_sum"] == pytest.approx(markers[1]["loss_sum"], rel=1e-5)  # steps 1-4, not 3-4
    twice = run_job(job, "twice")
    assert twice["status"] == "ok" and twice["resumed_from"] == 4
    for res in (once, twice):
        assert res["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-5)
        assert res["metrics"] == pytest.approx(whole["metrics"], abs=1e-6)
