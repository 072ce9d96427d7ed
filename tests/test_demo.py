"""The demo set shipped in kotune_data/demo (data=demo)."""
from __future__ import annotations

import collections
import subprocess
import sys

from conftest import ROOT, compose, shared_path
from tasks.io import read_records

DEMO = ROOT / "kotune_data" / "demo"


def demo_rows(split: str) -> list[dict]:
    return [row for _, row in read_records(str(DEMO / f"{split}.tsv"))]


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
    # 2,499 · hate 1,912 of 7,896), to the row
    for label, source in (("none", 3486), ("offensive", 2499), ("hate", 1912)):
        assert abs(counts[label] - len(train) * source / 7896) <= 1


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
