"""What a fresh ``pip install -e ".[dev]"`` resolved: no pre-release the project did not ask for.

pip takes pre-releases for a whole dependency tree as soon as one specifier names one (the Optuna
sweeper's ``hydra-core>=1.1.0.dev7`` let it pick hydra-core 1.4.0rc3, where every search crashed).
This walks kotune's installed requirements, recursively, and fails on any pre-release version. And the
install holds packages only: run.py and report.py are the repository's scripts, not top-level modules."""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ALLOWED_PRERELEASES: set[str] = set()  # names the project deliberately takes a pre-release of


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolved(root: str, extras: tuple[str, ...]) -> dict[str, str]:
    """name → installed version for ``root[extras]`` and everything it needs, transitively."""
    seen: dict[str, str] = {}
    todo = [(root, set(extras))]
    while todo:
        name, wanted = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-specific requirement that is not installed
        key = canonical(dist.metadata["Name"])
        if key in seen and not wanted:
            continue
        seen[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            if canonical(req.name) not in seen:
                todo.append((req.name, set(req.extras)))
    return seen


def test_no_unrequested_prerelease_in_the_resolved_set():
    try:
        metadata.distribution("kotune")
    except metadata.PackageNotFoundError:
        pytest.skip("kotune is not installed (pip install -e '.[dev]'): nothing resolved to check")
    found = resolved("kotune", ("dev",))
    assert "hydra-core" in found and "torch" in found, found
    pre = {n: v for n, v in found.items() if Version(v).is_prerelease and n not in ALLOWED_PRERELEASES}
    assert not pre, (f"pre-releases resolved: {pre}; pin a release in pyproject.toml "
                     "(a dependency's pre-release specifier lets pip take them)")


def test_the_sweeper_stack_is_the_tested_one():
    """kotune's Optuna sweeper is tested (tests/test_sweep.py) on hydra-core 1.3 / omegaconf 2.3 and
    optuna 4/5 on SQLAlchemy 2 (not hydra-optuna-sweeper's optuna<3 / SQLAlchemy<2)."""
    found = resolved("kotune", ("dev",))
    if "hydra-core" not in found:
        pytest.skip("kotune is not installed")
    assert Version(found["hydra-core"]).release[:2] == (1, 3)
    assert Version(found["omegaconf"]).release[:2] == (2, 3)
    assert 4 <= Version(found["optuna"]).major < 6 and Version(found["sqlalchemy"]).major >= 2
    assert "hydra-optuna-sweeper" not in found


def test_run_and_report_are_not_installed_as_top_level_modules(tmp_path):
    """Outside the repository ``import run`` / ``import report`` find nothing (pyproject has no
    py-modules); the package's kotune.cli.console and kotune.reporting are what the console command runs."""
    try:
        metadata.distribution("kotune")
    except metadata.PackageNotFoundError:
        pytest.skip("kotune is not installed")
    probe = "import importlib.util as u; print([m for m in ('run', 'report', 'kotune.cli.console', 'kotune.reporting') if u.find_spec(m)])"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['kotune.cli.console', 'kotune.reporting']"
