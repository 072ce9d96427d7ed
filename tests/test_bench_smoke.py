"""Every bench script's ``--smoke`` run (tiny settings, every code path of the real run): it must exit 0
and print its ``RESULT`` line. One test per script, each a fresh interpreter as a user runs it; a new
script in bench/ without an entry here fails ``test_every_bench_script_has_a_smoke_test``.

The scripts that fine-tune "the mini pretrained encoder" get one tiny pretrained encoder, built once
per session (``bench/pretrain_gain.py --smoke --only-pretrain``) into a cache shared by all workers;
every run writes under its test's temporary folder (TMPDIR, --out) and that cache, never the project
or the home folder.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SHARED, shared_path

BENCH = ROOT / "bench"
HELPERS = {"__init__.py", "common.py"}  # modules, not scripts
# script → its arguments besides --smoke; {model}: the tiny pretrained encoder, {out}: the test's
# folder, {cache}: the session's cache, {shared}: ../shared. Every script but those in NO_SHARED reads
# ../shared (skipped without it).
SCRIPTS = {
    "auprc_absent_class": [],
    "class_weights": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "dp_options": [],
    "frozen_cache": [],
    "hf_parity": [],
    "modes": ["--model-dir", "{model}", "--out", "{out}", "--cache-dir", "{cache}"],
    "multi_label": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "ner_crf": ["--model-dir", "{model}", "--out", "{out}", "--cache-dir", "{cache}"],
    "ner_decode": ["--out", "{out}"],
    "pretrain_compare": ["--out", "{out}", "--cache-dir", "{cache}"],
    "pretrain_gain": ["--out", "{out}", "--cache-dir", "{cache}"],
    "pretrain_speed": ["--cache-dir", "{cache}"],
    "pretrain_variants": ["--cache-dir", "{cache}"],
    "probe_layers": ["--out", "{out}", "--cache-dir", "{cache}"],
    "qa_decode": [],
    "serve_speed": ["--work", "{out}"],
    "sweep_pruning": ["--out", "{out}"],
    "throughput": ["--out", "{out}"],
}
NO_SHARED = {"auprc_absent_class", "sweep_pruning"}
# built first: pretrain_gain's --smoke recipe and cache are the encoder's, so its pretraining is reused
NEEDS_ENCODER = {"class_weights", "modes", "multi_label", "ner_crf", "pretrain_gain"}
TIMEOUT_S = 600


def smoke_env(cache: Path, tmp: Path) -> dict:
    return dict(os.environ, KOTUNE_CACHE=str(cache), KOTUNE_PROGRESS="0", TMPDIR=str(tmp),
                TOKENIZERS_PARALLELISM="false")


def run_smoke(script: str, args: list[str], cache: Path, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=smoke_env(cache, tmp))


def tail(proc: subprocess.CompletedProcess, chars: int = 4000) -> str:
    return f"stdout:\n{proc.stdout[-chars:]}\nstderr:\n{proc.stderr[-chars:]}"


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """The cache every smoke run shares (tokenizers, features, pretrainings), one for all workers of
    this session (pytest-xdist: the workers' base folders share a parent; never an earlier session's)."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "bench_smoke_cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_encoder(smoke_cache, tmp_path_factory) -> str:
    """The pretrained encoder of ``bench/pretrain_gain.py --smoke`` (its model/ folder), pretrained once
    per session: the first worker builds it under a lock, the others find it in the shared cache."""
    from filelock import FileLock

    shared_path("data/corpus")
    with FileLock(str(smoke_cache) + ".lock"):
        found = glob.glob(str(smoke_cache / "pretrain_gain" / "*" / "model" / "config.json"))
        if not found:
            tmp = tmp_path_factory.mktemp("tiny_encoder")
            proc = run_smoke("pretrain_gain", ["--only-pretrain", "--cache-dir", str(smoke_cache), "--out",
                                               str(tmp / "out")], smoke_cache, tmp)
            assert proc.returncode == 0, f"the tiny encoder's pretraining failed\n{tail(proc)}"
            found = glob.glob(str(smoke_cache / "pretrain_gain" / "*" / "model" / "config.json"))
        assert len(found) == 1, found
    return os.path.dirname(found[0])


def test_every_bench_script_has_a_smoke_test():
    scripts = {p.stem for p in BENCH.glob("*.py") if p.name not in HELPERS}
    assert scripts - set(SCRIPTS) == set(), "bench scripts without a --smoke test: add them to SCRIPTS"
    assert set(SCRIPTS) - scripts == set(), "SCRIPTS names scripts bench/ no longer has"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_smoke(script, request, smoke_cache, tmp_path):
    if script not in NO_SHARED:
        shared_path("data")
        shared_path("vocab")
    values = {"out": str(tmp_path / "out"), "cache": str(smoke_cache), "shared": str(SHARED)}
    if script in NEEDS_ENCODER:
        values["model"] = request.getfixturevalue("tiny_encoder")
    args = [a.format(**values) for a in SCRIPTS[script]]
    started = time.perf_counter()
    proc = run_smoke(script, args, smoke_cache, tmp_path)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"bench/{script}.py --smoke exited {proc.returncode} after {seconds:.0f} s\n{tail(proc)}"
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, f"bench/{script}.py --smoke printed no RESULT line\n{tail(proc)}"
