"""A command-line job's ``run.log`` holds kotune's log as the console shows it: the ``[kotune]``
lines, the closing table, the error line of a failed job (kotune/core/log.py run_log and say,
kotune/cli/main.py), masked as every log line is (kotune/core/redact.py); each job of a multirun its own."""
from __future__ import annotations

import pytest

from conftest import run_cli_here

TINY = ["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1"]


def test_a_train_runs_log_holds_its_log_lines_and_its_closing_table(tmp_path, cache_dir):
    run = tmp_path / "run"
    done = run_cli_here([*TINY, f"cache_dir={cache_dir}", f"hydra.run.dir={run}"])
    assert done.returncode == 0, done.stderr[-2000:]
    logged = (run / "run.log").read_text(encoding="utf-8")
    shown = [line for line in done.stdout.splitlines() if line.startswith("[kotune]") or line.startswith("  ")]
    assert any(line.startswith("[kotune] training:") for line in shown)
    assert any(line.split() == ["status", "ok"] for line in shown)
    assert f"  results: {run / 'results.json'}" in shown
    for line in shown:  # every log line and every row of the table, as the console showed it
        assert line in logged.splitlines(), line


def test_a_failed_jobs_run_log_ends_with_its_error_line(tmp_path, cache_dir):
    run = tmp_path / "run"
    done = run_cli_here([*TINY, "train.batch_size=0", f"cache_dir={cache_dir}", f"hydra.run.dir={run}"])
    assert done.returncode == 1
    line = "error: train.batch_size=0: a whole number >= 1 expected"
    assert done.stderr.strip() == line
    assert (run / "run.log").read_text(encoding="utf-8").splitlines()[-1] == line


def test_each_job_of_a_multirun_logs_into_its_own_run_log(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    done = run_cli_here(["-m", *TINY, "train.seed=1,2", f"cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}"])
    assert done.returncode == 0, done.stderr[-2000:]
    logs = sorted(sweep.rglob("run.log"))
    assert len(logs) == 2
    for path in logs:
        lines = path.read_text(encoding="utf-8").splitlines()
        results = [line.strip() for line in lines if line.strip().startswith("results: ")]
        assert results == [f"results: {path.parent / 'results.json'}"]  # its own table, not the other job's
        assert sum(line.startswith("[kotune] training:") for line in lines) == 1


def test_the_run_log_is_masked_as_the_console_is(tmp_path):
    from kotune.core.log import log, run_log, say

    path = tmp_path / "run.log"
    with run_log(str(path)):
        log("study storage postgresql://kotune:hunter2secret@db.example:5432/optuna")
        say("error: cannot reach postgresql://kotune:hunter2secret@db.example:5432/optuna", error=True)
    log("after the block: not in the file")
    text = path.read_text(encoding="utf-8")
    assert "hunter2secret" not in text and text.count("db.example") == 2
    assert "after the block" not in text


@pytest.fixture(autouse=True)
def no_progress(monkeypatch):
    monkeypatch.setenv("KOTUNE_PROGRESS", "0")
