"""Every bench script's ``--smoke`` run (tiny settings, every code path of the real run): it must exit 0
and print its ``RESULT`` line. One test per script, each a fresh interpreter as a user runs it (``python -m bench.<name>``
from the repository root); a new script in bench/ without an entry here fails
``test_every_bench_script_has_a_smoke_test``.

The scripts that fine-tune "the mini pretrained encoder" get one tiny pretrained encoder, built once
per session (``python -m bench.pretrain_gain --smoke --only-pretrain``) into a cache shared by all workers;
every run writes under its test's temporary folder (TMPDIR, --out) and that cache, never the project
or the home folder.
"""
from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SHARED, shared_path

BENCH = ROOT / "bench"
# modules the scripts share, or one script's parts (throughput_*: bench/throughput.py's), not scripts (a
# script imports these, never another script)
HELPERS = {"__init__.py", "common.py", "hate_speech.py", "jobs.py", "pretraining.py", "serving.py", "stats.py",
           "throughput_data.py", "throughput_report.py", "throughput_runs.py", "throughput_science.py"}
# script → its arguments besides --smoke; {model}: the tiny pretrained encoder, {out}: the test's
# folder, {cache}: the session's cache, {shared}: ../shared. Every script but those in NO_SHARED reads
# ../shared (skipped without it).
SCRIPTS = {
    "auprc_absent_class": [],
    "calibration": ["--model", "mini", "--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}",
                    "--cache-dir", "{cache}"],
    "class_weights": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "compile_speed": ["--cache-dir", "{cache}"],
    "distill": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "dp_options": [],
    "embeddings": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "few_shot": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "frozen_cache": [],
    "hf_parity": [],
    "label_issues": ["--out", "{out}", "--cache-dir", "{cache}"],
    "modes": ["--model-dir", "{model}", "--out", "{out}", "--cache-dir", "{cache}"],
    "multi_label": ["--model-dir", "{model}", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
    "ner_crf": ["--model-dir", "{model}", "--out", "{out}", "--cache-dir", "{cache}"],
    "ner_decode": ["--out", "{out}"],
    "padding_free": [],
    "pretrain_compare": ["--out", "{out}", "--cache-dir", "{cache}"],
    "pretrain_gain": ["--out", "{out}", "--cache-dir", "{cache}"],
    "pretrain_rtd": ["--out", "{out}", "--cache-dir", "{cache}"],
    "pretrain_speed": ["--cache-dir", "{cache}"],
    "pretrain_variants": ["--cache-dir", "{cache}"],
    "probe_layers": ["--out", "{out}", "--cache-dir", "{cache}"],
    "qa_decode": [],
    "rtd_diagnostics": ["--cache-dir", "{cache}"],
    "rtd_sample_speed": [],
    "serve_speed": ["--work", "{out}"],
    "sweep_pruning": ["--out", "{out}"],
    "throughput": ["--out", "{out}"],
}
# a script's other paths, each a smoke run of its own: "script:variant" → the script's arguments
VARIANTS = {
    "label_issues:ner": ["--task", "ner", "--shared", "{shared}", "--out", "{out}", "--cache-dir", "{cache}"],
}
NO_SHARED = {"auprc_absent_class", "compile_speed", "label_issues", "padding_free", "rtd_sample_speed", "sweep_pruning"}
# built first: pretrain_gain's --smoke recipe and cache are the encoder's, so its pretraining is reused
NEEDS_ENCODER = {"calibration", "class_weights", "distill", "embeddings", "few_shot", "modes", "multi_label", "ner_crf", "pretrain_gain"}
TIMEOUT_S = 600


def smoke_env(cache: Path, tmp: Path) -> dict:
    return dict(os.environ, KOTUNE_CACHE=str(cache), KOTUNE_PROGRESS="0", TMPDIR=str(tmp),
                TOKENIZERS_PARALLELISM="false")


def run_smoke(script: str, args: list[str], cache: Path, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"bench.{script}", "--smoke", *args], cwd=ROOT,
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
    """The pretrained encoder of ``python -m bench.pretrain_gain --smoke`` (its model/ folder), pretrained once
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
    assert {v.partition(":")[0] for v in VARIANTS} <= scripts, "VARIANTS names scripts bench/ no longer has"


def bench_imports(path: Path) -> set[str]:
    """The bench modules a file imports anywhere (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "bench" else [f"bench.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("bench.")}
    return found


def test_bench_scripts_import_helpers_never_another_script_nor_touch_sys_path():
    """bench/ is a package run as ``python -m bench.<name>``: no sys.path edits, and what several
    scripts need lives in a helper module (HELPERS), not in a script another one imports."""
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "sys.path.insert" not in text and "sys.path.append" not in text, f"{path.name} edits sys.path"
        scripts = {name for name in bench_imports(path) if f"{name}.py" not in HELPERS}
        assert not scripts, f"bench/{path.name} imports the script(s) {sorted(scripts)}: move what it needs to a helper"


def test_documented_bench_commands_run_the_module():
    """Every documented command says ``python -m bench.<name>`` (``python bench/<name>.py`` does not
    find the bench package) and names a script that exists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(BENCH.glob("*.py"))]
    for page in pages:
        text = page.read_text(encoding="utf-8").replace("\\_", "_")  # docs/reference/config.md escapes _ for markdown
        assert not re.search(r"python3? bench/", text), f"{page.relative_to(ROOT)}: python bench/<name>.py"
        for name in re.findall(r"python3? -m bench\.(\w+)", text):
            assert name in SCRIPTS, f"{page.relative_to(ROOT)}: python -m bench.{name} is no bench script"


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(SCRIPTS) + sorted(VARIANTS))
def test_bench_smoke(run, request, smoke_cache, tmp_path):
    script = run.partition(":")[0]
    if run not in NO_SHARED:  # a variant reads ../shared unless listed itself
        shared_path("data")
        shared_path("vocab")
    values = {"out": str(tmp_path / "out"), "cache": str(smoke_cache), "shared": str(SHARED)}
    if run in NEEDS_ENCODER:
        values["model"] = request.getfixturevalue("tiny_encoder")
    args = [a.format(**values) for a in {**SCRIPTS, **VARIANTS}[run]]
    started = time.perf_counter()
    proc = run_smoke(script, args, smoke_cache, tmp_path)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"python -m bench.{script} --smoke exited {proc.returncode} after {seconds:.0f} s\n{tail(proc)}"
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, f"python -m bench.{script} --smoke printed no RESULT line\n{tail(proc)}"
