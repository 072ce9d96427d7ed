"""The ``kotune`` console command (pyproject's [project.scripts], kotune/cli/console.py) is ``python run.py``:
the same arguments give the same config, it runs a job, and it sets OMP_WAIT_POLICY before torch
loads; ``kotune report DIR`` is ``python report.py DIR``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from conftest import ROOT

ARGS = ["task=text_cls", "model=tiny", "data=sample"]


def console_script() -> Path:
    script = Path(sys.executable).parent / ("kotune.exe" if os.name == "nt" else "kotune")
    if not script.exists():
        pytest.fail(f"{script} is missing: the console command comes with pip install -e '.[dev]' (run it again)")
    return script


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # conftest sets it for itself
    return dict(env, KOTUNE_CACHE=str(tmp_path / "cache"), KOTUNE_PROGRESS="0", **extra)


def test_the_entry_point_is_a_package_function():
    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "kotune"]
    assert entry.value == "kotune.cli.console:main"


def test_kotune_and_python_run_py_compose_the_same_config(tmp_path):
    env = environment(tmp_path)
    runs = [subprocess.run(cmd + ARGS + ["train.learning_rate=3e-4", "--cfg", "job"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
            for cmd in ([str(console_script())], [sys.executable, str(ROOT / "run.py")])]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert "learning_rate: 0.0003" in runs[0].stdout
    assert runs[0].stdout == runs[1].stdout


def test_kotune_runs_a_job_where_python_run_py_would(tmp_path):
    proc = subprocess.run([str(console_script()), *ARGS, "train.max_steps=2", "train.eval_batch_size=8"],
                          cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (results,) = tmp_path.glob("outputs/text_cls/tiny/finetune/*/results.json")
    assert json.loads(results.read_text())["status"] == "ok"


@pytest.mark.parametrize("given, seen", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_entry_point_sets_omp_wait_policy_before_torch_loads(tmp_path, given, seen):
    """The value torch reads when it loads: the entry point's default, or the user's own. ``--cfg job``
    answers before anything loads torch (kotune.cli.main imports none of it): the import after it, in
    the same process, is then the first, and must see what the entry point set."""
    probe = textwrap.dedent("""
        import os, sys
        from importlib import metadata
        class Watch:  # records OMP_WAIT_POLICY at the moment torch is first imported
            def find_spec(self, name, path=None, target=None):
                if name == "torch":
                    print("OMP_WAIT_POLICY at torch import:", os.environ.get("OMP_WAIT_POLICY"), flush=True)
                    sys.meta_path.remove(self)
                return None
        sys.meta_path.insert(0, Watch())
        (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "kotune"]
        sys.argv = ["kotune", "task=text_cls", "model=tiny", "--cfg", "job"]
        try:
            entry.load()()
        finally:
            import torch  # noqa: F401
    """)
    env = environment(tmp_path, **({"OMP_WAIT_POLICY": given} if given else {}))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"OMP_WAIT_POLICY at torch import: {seen}" in proc.stdout.splitlines()


def test_kotune_report_is_python_report_py(tmp_path):
    """``kotune report DIR`` dispatches before Hydra and writes what ``python report.py DIR`` writes."""
    run = tmp_path / "runs" / "nli_klue" / "results.json"
    run.parent.mkdir(parents=True)
    run.write_text(json.dumps({"task": "nli", "model": "klue", "mode": "finetune", "action": "train", "seed": 1,
                               "status": "ok", "main_metric": "accuracy", "metrics": {"accuracy": 81.5},
                               "config_hash": "h1", "config": {"train": {"seed": 1}}}))
    env = environment(tmp_path)
    outs = {}
    for name, cmd in (("kotune", [str(console_script()), "report"]), ("script", [sys.executable, str(ROOT / "report.py")])):
        proc = subprocess.run(cmd + [str(tmp_path / "runs"), "--out", str(tmp_path / name)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[name] = (tmp_path / name / "leaderboard.md").read_text(encoding="utf-8")
    assert "81.50 (1)" in outs["kotune"] and outs["kotune"] == outs["script"]
    assert not (tmp_path / "outputs").exists()  # no Hydra run: nothing read "report" as an override
    bad = subprocess.run([str(console_script()), "report", str(tmp_path / "missing")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "is not a directory" in bad.stderr
