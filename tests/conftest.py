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
# Under pytest-xdist each worker has a core to itself: one torch thread each, so two workers on two
# cores do not oversubscribe them (subprocesses the tests start inherit it)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def shared_path(rel: str) -> Path:
    """A file under ../shared, or skip the test with the reason."""
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"../shared absent ({path} not found): real-data test skipped")
    return path


def compose(overrides: list[str]):
    """A job's config as the command line composes it (kotune.cli.overrides: checkpoint= included)."""
    from kotune.cli.overrides import compose as kotune_compose

    return kotune_compose(overrides, str(ROOT / "conf"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One tokenizer/feature cache for the session (trained tiny tokenizers are reused)."""
    return str(tmp_path_factory.mktemp("kotune_cache"))


@pytest.fixture
def run_job(tmp_path, cache_dir):
    """Run one job in-process: returns the results dict (also written to run_dir/results.json)."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

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


def run_cli_here(args: list[str]) -> subprocess.CompletedProcess:
    """``run_cli(args)`` in this process: the command line's own entry point (``kotune.cli.main.run``,
    which ``run.py`` calls) on ``args``, its stdout, stderr and exit status returned as the
    subprocess's would be; sys.argv, os.environ and the root logger (Hydra configures it) are
    restored after. Seconds cheaper than a new interpreter, for checks that need no fresh process:
    nothing read from the environment at import (HF_HUB_OFFLINE), no other working directory."""
    import contextlib
    import io
    import logging

    from hydra.core.global_hydra import GlobalHydra

    from kotune.cli.main import run

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    sys.argv = [str(ROOT / "run.py"), *args]
    os.environ["KOTUNE_PROGRESS"] = "0"
    GlobalHydra.instance().clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run()
            except SystemExit as e:  # sys.exit(n) as the process would end; sys.exit("text") prints it, status 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        GlobalHydra.instance().clear()
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return subprocess.CompletedProcess([sys.executable, str(ROOT / "run.py"), *args], code, out.getvalue(),
                                       err.getvalue())


def assert_best_evaluation_kept(run_dir: Path, res: dict) -> None:
    """A ``train.select_best`` run's results against the evaluations Trainer logged (the newest
    checkpoint's trainer_state.json holds them all): ``best_step`` is the first best of the main
    metric, ``metrics`` are that evaluation's, ``metrics_last`` the last one's."""
    states = sorted((run_dir / "checkpoints").glob("checkpoint-*/trainer_state.json"),
                    key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(states[-1].read_text())["log_history"]
    main = res["main_metric"]
    greater = res["config"]["task"].get("greater_is_better", True)
    evals = [h for h in history if f"eval_{main}" in h]
    best = evals[0]
    for h in evals[1:]:  # Trainer keeps an earlier best on a tie (strictly better replaces it)
        if (h[f"eval_{main}"] > best[f"eval_{main}"]) if greater else (h[f"eval_{main}"] < best[f"eval_{main}"]):
            best = h
    assert res["best_step"] == best["step"], (res["best_step"], [(h["step"], h[f"eval_{main}"]) for h in evals])
    assert res["metrics"][main] == pytest.approx(best[f"eval_{main}"], abs=1e-9, nan_ok=True), (res["metrics"], best)
    assert set(res["metrics_last"]) == set(res["metrics"])
    last = {k: evals[-1][f"eval_{k}"] for k in res["metrics_last"]}
    assert res["metrics_last"] == pytest.approx(last, abs=1e-9, nan_ok=True), (res["metrics_last"], evals[-1])


def encoder_inputs(overrides: list[str], split: str) -> dict[str, list]:
    """What the encoder reads from ``split`` (its input ids, type ids and masks, row by row) in the
    run that ``overrides`` describe: two files give a model the same inputs, or not."""
    from kotune.loading.build import build

    features = build(compose(overrides), (split,)).features[split]
    return {c: features[c] for c in ("input_ids", "token_type_ids", "attention_mask") if c in features.column_names}
