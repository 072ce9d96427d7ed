"""Cross-validation (data.folds=K data.fold=i): the folds partition the training data (no example in
two evaluation folds, none left out), keep data.group_column's groups whole, are the same for every
fold's run, refuse what does not fit in one line, and `-m data.fold=...` gives one report row."""
from __future__ import annotations

import csv
import json
import random
import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose, run_cli


def test_assigned_folds_partition_the_rows_keep_groups_whole_and_balance_sizes():
    from tasks.folds import assign_folds

    rows = assign_folds([None] * 23, 5, seed=0)
    assert sorted({*rows}) == [0, 1, 2, 3, 4] and len(rows) == 23
    sizes = [rows.count(f) for f in range(5)]
    assert max(sizes) - min(sizes) <= 1
    assert assign_folds([None] * 23, 5, seed=0) == rows != assign_folds([None] * 23, 5, seed=1)
    rng = random.Random(0)
    groups = [f"g{rng.randrange(12)}" for _ in range(60)] + [None] * 10
    folds = assign_folds(groups, 4, seed=3)
    for g in set(groups) - {None}:
        assert len({f for f, key in zip(folds, groups) if key == g}) == 1, g
    largest = max(groups.count(g) for g in set(groups) - {None})
    sizes = [folds.count(f) for f in range(4)]
    assert max(sizes) - min(sizes) <= largest


def grouped_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.tsv"
    rows = [(f"문장 {i}번은 {'좋다' if i % 3 else '나쁘다'}", "pos" if i % 3 else "neg", f"writer{i % 7}") for i in range(41)]
    path.write_text("text\tlabel\twriter\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("group_column", [None, "writer"])
def test_the_evaluation_folds_cover_the_training_data_once(tmp_path, group_column):
    from tasks import build_task
    from tasks.base import load_splits

    path = grouped_file(tmp_path)
    task = build_task(compose(["task=text_cls"]).task)
    every = [ex["id"] for ex in task.read_file(str(path))]
    seen: list[str] = []
    for fold in range(5):
        data = OmegaConf.create({"train_file": str(path), "folds": 5, "fold": fold, "group_column": group_column})
        splits = load_splits(task, data, ("train", "validation"), seed=fold + 1)  # the training seed: no effect
        train, held = ([ex["id"] for ex in splits[s].examples] for s in ("train", "validation"))
        assert sorted(train + held) == sorted(every) and not set(train) & set(held)
        assert splits["validation"].source["part"] == f"fold {fold}" and splits["validation"].source["folds"] == 5
        if group_column:  # a writer's rows are all in this fold or all outside it
            writers = {ex["group"] for ex in splits["validation"].examples}
            assert not writers & {ex["group"] for ex in splits["train"].examples}
        seen += held
    assert sorted(seen) == sorted(every)  # no example in two evaluation folds, none in none


@pytest.mark.parametrize("settings,error", [
    ({"folds": 5}, "data.folds=5 needs data.fold=0..4"),
    ({"folds": 5, "fold": 5}, "data.fold=5: expected an integer from 0 to 4"),
    ({"fold": 1}, "data.fold=1 needs data.folds=K"),
    ({"folds": 1, "fold": 0}, "data.folds=1: expected an integer of at least 2"),
    ({"folds": 3, "fold": 0, "validation_split": 0.2}, "data.validation_split=0.2 is set too"),
    ({"folds": 3, "fold": 0, "group_column": "nope"}, "has no column 'nope'"),
    ({"folds": 50, "fold": 0, "group_column": "writer"}, "the rows form 7 group(s), fewer than the 50 folds"),
])
def test_folds_that_do_not_fit_are_one_line_errors(tmp_path, settings, error):
    from tasks import build_task
    from tasks.base import load_splits
    from tasks.errors import KotuneError

    task = build_task(compose(["task=text_cls"]).task)
    with pytest.raises(KotuneError) as e:
        load_splits(task, OmegaConf.create({"train_file": str(grouped_file(tmp_path)), **settings}),
                    ("train", "validation"), seed=1)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_a_task_whose_format_has_no_group_column_refuses_one(run_job):
    res = run_job(["task=ner", "model=tiny", "data=sample", "data.group_column=doc", "train.max_steps=1"])
    assert res["status"] == "failed" and "task ner has no group column" in res["error"]


def test_a_multirun_over_the_folds_is_one_report_row(tmp_path, cache_dir):
    import report

    sweep = tmp_path / "cv"
    proc = run_cli(["-m", "task=text_cls", "model=tiny", "data=sample", "data.folds=3",
                    "data.fold=0,1,2", "train.max_steps=2", "save_model=false", f"cache_dir={cache_dir}",
                    f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert sorted(r["config"]["data"]["fold"] for r in results) == [0, 1, 2]
    held = [r["n_eval"] for r in results]
    assert sum(held) == 80 and all(r["n_train"] + r["n_eval"] == 80 for r in results)
    scores = [r["metrics"]["macro_f1"] for r in results]

    assert report.main([str(sweep)]) == 0
    with open(sweep / "leaderboard.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    assert float(rows[0]["text_cls.macro_f1.mean"]) == pytest.approx(statistics.fmean(scores), abs=1e-4)
    assert float(rows[0]["text_cls.macro_f1.std"]) == pytest.approx(statistics.stdev(scores), abs=1e-4)
    assert rows[0]["text_cls.macro_f1.n"] == "3"
    assert "Incomplete cross-validation" not in (sweep / "leaderboard.md").read_text()

    next(sweep.rglob("results.json")).unlink()  # a fold lost: the row says it is no 3-fold estimate
    assert report.main([str(sweep)]) == 0
    md = (sweep / "leaderboard.md").read_text()
    assert "## Incomplete cross-validation" in md and "of 3 ran ok" in md
