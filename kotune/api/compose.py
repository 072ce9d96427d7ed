"""How the Python API (kotune/api/__init__.py) composes and runs a job as the command line does: the same
argv checks (kotune/cli/main.py: unknown choices), rewrites and key checks (kotune/cli/overrides.py), then
Hydra's compose API with its global state cleared after (re-entrant: a notebook calls it again and
again), then ``kotune.cli.job.execute``. A failed job raises :class:`RunFailed`."""
from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path
from typing import Any

from kotune.core.errors import ConfigError, KotuneError

RUNS_DIR = "outputs"  # the command line's default root (conf/config.yaml hydra.run.dir), under the working directory


class RunFailed(KotuneError):
    """A job that ended with ``status: failed``: the message is its one-line error; ``results``
    (the results.json dict) and ``dir`` (its run directory) say more."""

    def __init__(self, results: dict, run_dir: Path):
        super().__init__(str(results.get("error") or "the job failed"))
        self.results, self.dir = results, Path(run_dir)
        self.error_type = results.get("error_type")


# ---- composing and running a job ------------------------------------------------------------
def override_value(value: Any) -> str:
    """A keyword argument's value as an override value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    return str(value)


def as_overrides(overrides: tuple, kw: dict) -> list[str]:
    """Positional overrides as typed (``"train.max_steps=6"``), then keyword ones: ``task="nli"``
    is ``task=nli``, a double underscore is a dot (``train__max_steps=6``)."""
    out = []
    for o in overrides:
        if not isinstance(o, str):
            raise ConfigError(f"an override is a string KEY=VALUE, got {type(o).__name__} {o!r}")
        out.append(o)
    return out + [f"{key.replace('__', '.')}={override_value(value)}" for key, value in kw.items()]


def compose_job(overrides: list[str]):
    """The job's config as the command line composes it: unknown choices and keys refused in the
    command line's one line (kotune/cli/main.py, kotune/cli/overrides.py), then ``kotune.cli.overrides.compose``."""
    from hydra.core.global_hydra import GlobalHydra

    from kotune.cli.main import check_choices
    from kotune.cli.config import CONF_DIR
    from kotune.cli.overrides import bad_override, compose, job_overrides

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            check_choices(overrides)
    except SystemExit:
        raise ConfigError(said.getvalue().strip().removeprefix("error: ") or "unknown choice") from None
    rewritten = job_overrides(overrides)  # checkpoint=RUN: its presets and task options (logged once)
    problem = bad_override(rewritten)
    if problem:
        raise ConfigError(problem)
    try:
        return compose(rewritten, CONF_DIR)
    except KotuneError:
        raise
    except Exception as e:  # noqa: BLE001 - Hydra's own message (a malformed override), as one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{type(e).__name__}: {first}") from None
    finally:
        GlobalHydra.instance().clear()


def default_run_dir(cfg) -> Path:
    """Where the command line would write the run (``outputs/<task>/<model>/<mode>/<date_time>``,
    relative to the working directory), made unique within the second by a ``-N`` suffix."""
    base = Path(RUNS_DIR) / str(cfg.task.name) / str(cfg.model.name) / str(cfg.mode.name) / time.strftime(
        "%Y-%m-%d_%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def run_job(overrides: list[str], run_dir: str | os.PathLike | None) -> tuple[dict, Path]:
    """Compose, run, and return (results, run directory); a failed job raises :class:`RunFailed`."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    cfg = compose_job(overrides)
    folder = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    quiet_libraries()
    results = execute(cfg, str(folder))
    if results.get("status") not in ("ok", "pruned"):
        raise RunFailed(results, folder)
    return results, folder
