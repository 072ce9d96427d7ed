"""Shared test helpers: compose configs, run jobs in-process or through the CLI, find ../shared."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
# As run.py does for the CLI (read when torch loads, so before any test imports it): idle OpenMP
# threads sleep instead of spinning. On a shared CPU spinning threads stall each other: the hate
# speech test took >15 min instead of 42 s on a busy 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def shared_path(rel: str) -> Path:
    """A file under ../shared, or skip the test with the reason."""
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"../shared absent ({path} not found): real-data test skipped")
    return path


def compose(overrides: list[str]):
    """A job's config as the command line composes it (kotune.overrides: checkpoint= included)."""
    from kotune.overrides import compose as kotune_compose

    return kotune_compose(overrides, str(ROOT / "conf"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One tokenizer/feature cache for the session (trained tiny tokenizers are reused)."""
    return str(tmp_path_factory.mktemp("kotune_cache"))


@pytest.fixture
def run_job(tmp_path, cache_dir):
    """Run one job in-process: returns the results dict (also written to run_dir/results.json)."""
    from kotune.job import execute
    from kotune.runtime import quiet_libraries

    def _run(overrides: list[str], name: str = "job") -> dict:
        cfg = compose(overrides + [f"cache_dir={cache_dir}"])
        quiet_libraries()
        results = execute(cfg, str(tmp_path / name))
        assert json.loads((tmp_path / name / "results.json").read_text())["status"] == results["status"]
        return results

    return _run


def run_cli(args: list[str], timeout: int = 600, env: dict | None = None, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` as a user types it (in ``cwd``: where outputs/ goes; default the repository)."""
    full_env = dict(os.environ, KOTUNE_PROGRESS="0", **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
