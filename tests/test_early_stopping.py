"""Early stopping (``train.early_stopping_patience``): results.json says where training stopped and
the best step, a run killed after a checkpoint resumes with its patience counter (so it stops where
the uninterrupted run stops), a stopped run's rerun gives its results again, and the option without
``train.select_best`` is refused in one line.

The learning rate is so small that the main metric never moves: every evaluation after the first
fails to improve, so patience 2 with an evaluation every step stops at step 3 — and a resume that
forgot its counter at checkpoint 2 would stop at step 4."""
from __future__ import annotations

import pytest

from test_action_matrix import COMPARED, copy_run, same

STOPPING = ["task=text_cls", "model=tiny", "data=sample", "train=klue", "train.epochs=20", "train.batch_size=16",
            "train.learning_rate=1e-9", "train.early_stopping_patience=2", "train.save_total_limit=null"]


def test_stopped_run_records_where_and_resumes_with_its_patience_counter(run_job, tmp_path):
    first = run_job(STOPPING, "run")
    assert first["status"] == "ok", first.get("error")
    assert first["early_stopping"] == {"patience": 2, "threshold": 0.0, "stopped_step": 3, "max_steps": 100,
                                       "stopped_early": True, "evaluations": 3}
    assert first["best_step"] == 1

    killed = copy_run(tmp_path / "run", tmp_path / "killed", keep_checkpoints=2)  # counter 1 at checkpoint 2
    resumed = run_job(STOPPING, "killed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == 2, resumed.get("error")
    same(resumed, first, COMPARED)
    assert not (killed / "checkpoints" / "checkpoint-4").exists()

    rerun = run_job(STOPPING, "run")  # finished: its stop checkpoint is marked, nothing trains again
    assert rerun["resumed_from"] == 3
    same(rerun, first, COMPARED)


@pytest.mark.parametrize("extra,message", [
    ([], "train.early_stopping_patience=2 needs train.select_best=true"),
    (["train.select_best=true", "train.early_stopping_patience=0"], "train.early_stopping_patience=0: null or a whole number >= 1"),
])
def test_early_stopping_without_what_it_needs_is_refused_in_one_line(run_job, extra, message):
    res = run_job(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=2",
                   "train.early_stopping_patience=2", *extra])
    assert res["status"] == "failed" and "\n" not in res["error"] and message in res["error"]


def test_the_stop_is_said_in_the_log_and_the_closing_table(tmp_path, cache_dir):
    from conftest import run_cli_here

    out = run_cli_here([*STOPPING, f"cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'cli'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in out.stdout.splitlines() if line.startswith("[kotune] early stopping:")]
    assert said == ["[kotune] early stopping: macro_f1 did not improve by more than 0.0 for 2 evaluations in a "
                    "row: stopped at step 3 of 100 (best step 1)"]
    table = {line.split("  ")[1].strip(): line.rsplit("  ", 1)[1].strip()
             for line in out.stdout.splitlines() if line.startswith("  ") and "  " in line.strip()}
    assert table.get("early stopping") == "step 3 of 100 (patience 2)"
    assert table.get("best_step") == "1"
