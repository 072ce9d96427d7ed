"""The README's first command: the demo set shipped in kotune_data/demo, and the command run in a
bare copy of the repository (no ../shared beside it) from another working directory."""
from __future__ import annotations

import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, compose, shared_path
from tasks.io import read_records

DEMO = ROOT / "kotune_data" / "demo"
GENERATED = (".git", "outputs", "multirun", "__pycache__", "*.egg-info", ".pytest_cache", "build", ".kotune_cache")


def readme_demo_args() -> list[str]:
    """The arguments of the README's command 1 (``python run.py task=text_cls …``)."""
    match = re.search(r"python run\.py (task=text_cls[^\n`]*)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert match, "README.md has no 'python run.py task=text_cls …' command"
    return shlex.split(match.group(1).split("#")[0])


def demo_rows(split: str) -> list[dict]:
    return [row for _, row in read_records(str(DEMO / f"{split}.tsv"))]


def copy_repository(dest: Path) -> None:
    """What a clone holds: the tracked and untracked-but-not-ignored files (git), else the tree
    without what runs and installs generate."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True)
    if listing.returncode != 0:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*GENERATED))
        return
    for rel in filter(None, listing.stdout.split("\0")):
        if (ROOT / rel).is_file():  # a deleted, not yet committed file is still listed
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


def test_data_demo_reads_the_packaged_files_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = compose(["task=text_cls", "model=tiny", "data=demo"]).data
    assert data.train_file == str(DEMO / "train.tsv") and data.validation_file == str(DEMO / "dev.tsv")


def test_the_demo_set_is_small_stratified_and_keeps_dev_out_of_train():
    train, dev = demo_rows("train"), demo_rows("dev")
    assert sum(f.stat().st_size for f in DEMO.iterdir() if f.is_file()) < 1_000_000
    assert {tuple(r) for r in train + dev} == {("id", "comments", "hate")}
    assert not {r["comments"].strip() for r in dev} & {r["comments"].strip() for r in train}
    assert all(r["id"].startswith("train-") for r in train) and all(r["id"].startswith("dev-") for r in dev)
    counts = collections.Counter(r["hate"] for r in train)
    assert set(counts) == {"none", "offensive", "hate"}
    # stratified: each label's share of the sample is the source train's (none 3,486 · offensive
    # 2,499 · hate 1,911 of 7,896), to the row
    for label, source in (("none", 3486), ("offensive", 2499), ("hate", 1911)):
        assert abs(counts[label] - len(train) * source / 7896) <= 1


def test_the_data_card_and_the_readme_count_what_the_files_hold():
    card = (DEMO / "README.md").read_text(encoding="utf-8")
    rows = {split: demo_rows(split) for split in ("train", "dev")}
    for split, said in rows.items():
        line = card.split(f"- `{split}.tsv`: ")[1].split("\n- ")[0]
        stated = {label: int(n.replace(",", "")) for label, n in re.findall(r"(none|offensive|hate) ([\d,]+)", line)}
        assert stated == dict(collections.Counter(r["hate"] for r in said)), split
        assert f"{len(said):,} " in line.split("(")[0], split
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{len(rows['train']):,} to train on, {len(rows['dev']):,} to score" in readme


def test_the_script_draws_the_shipped_files_from_the_source(tmp_path):
    source = shared_path("data/hate-speech")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--source", str(source),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    for name in ("train.tsv", "dev.tsv"):
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes()
        assert (tmp_path / name).read_bytes() != (source / name).read_bytes()  # not a copy of ../shared


def test_the_demo_files_are_packaged():
    """pyproject's package data ships the demo set, its README (attribution) and its license."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "kotune_data" in project["packages"]["find"]["include"]
    patterns = project["package-data"]["kotune_data"]
    shipped = {p.name for pattern in patterns for p in (ROOT / "kotune_data").glob(pattern)}
    assert {"train.tsv", "dev.tsv", "README.md", "LICENSE-CC-BY-SA-4.0.txt", "klue_paper.csv"} <= shipped


@pytest.mark.slow
def test_the_readme_demo_learns_in_a_bare_clone_from_another_directory(tmp_path):
    """The README's command 1 in a copy of the repository alone (no ../shared beside it), run from
    another working directory: it reads the copy's packaged demo set, a random encoder at its
    default rate (5e-4) learns clearly above the majority class, with no Hydra warning, and
    results.json lands where the README says."""
    clone, elsewhere = tmp_path / "clone" / "kotune", tmp_path / "elsewhere"
    copy_repository(clone)
    elsewhere.mkdir()
    assert not (clone.parent / "shared").exists()
    env = dict(os.environ, PYTHONPATH=str(clone), KOTUNE_CACHE=str(tmp_path / "cache"), KOTUNE_PROGRESS="0")
    proc = subprocess.run([sys.executable, str(clone / "run.py"), *readme_demo_args()], cwd=elsewhere,
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "version_base" not in proc.stderr and "could not discover" not in proc.stderr.lower()
    (results,) = elsewhere.glob("outputs/text_cls/tiny/finetune/*/results.json")
    res = json.loads(results.read_text())
    assert res["status"] == "ok" and res["config"]["train"]["learning_rate"] == pytest.approx(5e-4)
    assert {s: Path(res["data"][s]["file"]) for s in ("train", "validation")} == {
        "train": clone / "kotune_data" / "demo" / "train.tsv", "validation": clone / "kotune_data" / "demo" / "dev.tsv"}
    golds = [row["hate"] for row in demo_rows("dev")]
    majority = 100 * collections.Counter(golds).most_common(1)[0][1] / len(golds)
    print(f"demo dev accuracy {res['metrics']['accuracy']:.2f} vs majority {majority:.2f}")
    assert res["metrics"]["accuracy"] >= majority + 10
