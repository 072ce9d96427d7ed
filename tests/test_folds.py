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


def share_gap(folds: list[int], labels: list[str], k: int) -> float:
    """The largest gap, in points, between a class's share of a fold and its share of the file."""
    gaps = []
    for f in range(k):
        fold = [y for y, a in zip(labels, folds) if a == f]
        gaps += [abs(100 * fold.count(c) / len(fold) - 100 * labels.count(c) / len(labels)) for c in set(labels)]
    return max(gaps)


@pytest.mark.parametrize("seed", range(4))
def test_folds_are_stratified_by_label(seed):
    """Rows without groups are dealt class by class: each class's count in each fold, and each
    fold's size, differ by at most one; the partition still moves with the seed."""
    from tasks.folds import assign_folds

    rng = random.Random(seed)
    labels = rng.choices(["none", "offensive", "hate", "rare"], weights=[50, 30, 17, 3], k=203)
    folds = assign_folds([None] * len(labels), 5, seed, labels)
    for c in set(labels):
        counts = [sum(1 for y, f in zip(labels, folds) if y == c and f == k) for k in range(5)]
        assert max(counts) - min(counts) <= 1, (c, counts)
    sizes = [folds.count(k) for k in range(5)]
    assert max(sizes) - min(sizes) <= 1
    assert folds == assign_folds([None] * len(labels), 5, seed, labels) != assign_folds([None] * len(labels), 5,
                                                                                          seed + 1, labels)
    assert share_gap(folds, labels, 5) < share_gap(assign_folds([None] * len(labels), 5, seed), labels, 5)


@pytest.mark.parametrize("seed", range(4))
def test_stratified_folds_keep_groups_whole_and_nearer_the_class_shares(seed):
    from tasks.folds import assign_folds

    rng = random.Random(seed)
    groups, labels = [], []
    for g in range(80):  # writers of 1-4 comments, mostly of one class
        main = rng.choices(["none", "offensive", "hate"], weights=[50, 32, 18])[0]
        for _ in range(rng.randint(1, 4)):
            groups.append(f"w{g}")
            labels.append(main if rng.random() < 0.8 else rng.choice(["none", "offensive", "hate"]))
    folds = assign_folds(groups, 5, seed, labels)
    for g in set(groups):
        assert len({f for f, key in zip(folds, groups) if key == g}) == 1, g
    sizes = [folds.count(k) for k in range(5)]
    assert max(sizes) - min(sizes) <= 4  # the largest group
    assert share_gap(folds, labels, 5) < share_gap(assign_folds(groups, 5, seed), labels, 5)


def test_what_folds_are_stratified_by():
    from tasks import build_task
    from tasks.folds import fold_stratum

    text_cls, sts = (build_task(compose([f"task={t}"]).task) for t in ("text_cls", "sts"))
    multi, ner = (build_task(compose([f"task={t}"]).task) for t in ("multi_label", "ner"))
    assert fold_stratum(text_cls, {"label": "pos"}) == "pos"
    assert fold_stratum(sts, {"label": 3.2}) is None  # a regression target: not stratified
    assert fold_stratum(multi, {"label": ["b", "a"]}) == ("a", "b") == fold_stratum(multi, {"label": ["a", "b"]})
    assert fold_stratum(ner, {"tokens": ["가"], "tags": ["O"]}) is None


def grouped_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.tsv"
    rows = [(f"문장 {i}번은 {'좋다' if i % 3 else '나쁘다'}", "pos" if i % 3 else "neg", f"writer{i % 7}") for i in range(41)]
    path.write_text("text\tlabel\twriter\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("group_column", [None, "writer"])
def test_the_evaluation_folds_cover_the_training_data_once(tmp_path, group_column):
    from tasks import build_task
    from tasks.splits import load_splits

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
    from tasks.splits import load_splits
    from kotune.core.errors import KotuneError

    task = build_task(compose(["task=text_cls"]).task)
    with pytest.raises(KotuneError) as e:
        load_splits(task, OmegaConf.create({"train_file": str(grouped_file(tmp_path)), **settings}),
                    ("train", "validation"), seed=1)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_fold_labels_follow_the_files_shares(tmp_path):
    """Through load_splits: each validation fold of the 41-row file (27 pos, 14 neg) holds 5 or 6
    pos and 2 or 3 neg."""
    from tasks import build_task
    from tasks.splits import load_splits

    task = build_task(compose(["task=text_cls"]).task)
    for fold in range(5):
        data = OmegaConf.create({"train_file": str(grouped_file(tmp_path)), "folds": 5, "fold": fold})
        held = [ex["label"] for ex in load_splits(task, data, ("train", "validation"), seed=1)["validation"].examples]
        assert held.count("pos") in (5, 6) and held.count("neg") in (2, 3), held
    # fold_stratify=false: the plain shuffle's partition, as before stratification
    plain = [load_splits(task, OmegaConf.create({"train_file": str(grouped_file(tmp_path)), "folds": 5, "fold": f,
                                                 "fold_stratify": False}), ("train", "validation"), seed=1)
             for f in range(5)]
    from tasks.folds import assign_folds

    every = plain[0]["train"].examples + plain[0]["validation"].examples
    order = {ex["id"]: i for i, ex in enumerate(task.read_file(str(grouped_file(tmp_path))))}
    expected = assign_folds([None] * len(every), 5, 0)
    for f, splits in enumerate(plain):
        assert sorted(order[ex["id"]] for ex in splits["validation"].examples) == [i for i, a in enumerate(expected) if a == f]


SAMPLE_CV = ["task=text_cls", "model=tiny", "data=sample", "data.folds=3", "data.fold=0", "train.max_steps=4",
             "train.batch_size=16", "train.select_best=true", "save_model=false"]


def test_a_fold_selects_on_the_fold_it_reports_and_says_so(run_job, tmp_path):
    from conftest import assert_best_evaluation_kept

    res = run_job(SAMPLE_CV, "fold")
    assert res["status"] == "ok", res.get("error")
    assert res["selected_on"] == "validation fold" and res["n_select"] is None
    assert_best_evaluation_kept(tmp_path / "fold", res)  # the reported score is the selecting one
    plain = run_job(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1", "save_model=false"], "plain")
    assert plain["selected_on"] is None


def test_inner_selection_holds_a_slice_of_the_training_folds_out(run_job, tmp_path):
    """data.fold_selection=inner: the checkpoint is selected on a seeded slice of the training folds
    (data.inner_split), held out of training; the validation fold is only scored."""
    from kotune.loading.build import build
    from kotune.training.trainer import make_trainer

    res = run_job([*SAMPLE_CV, "data.fold_selection=inner", "data.inner_split=0.2"], "inner")
    assert res["status"] == "ok", res.get("error")
    assert res["selected_on"] == "inner slice of the training folds"
    assert res["n_train"] + res["n_select"] + res["n_eval"] == 80 and res["n_select"] == round(0.2 * (80 - res["n_eval"]))
    assert res["data"]["select"]["part"] == "select" and res["data"]["validation"]["part"] == "fold 0"

    cfg = compose([*SAMPLE_CV, "data.fold_selection=inner", "data.inner_split=0.2"])
    b = build(cfg, ("train", "validation", "select"))
    ids = {s: {ex["id"] for ex in b.splits[s].examples} for s in ("train", "validation", "select")}
    assert not ids["select"] & ids["validation"] and not ids["select"] & ids["train"]
    trainer = make_trainer(cfg, b, str(tmp_path / "t"))
    assert len(trainer.eval_dataset) == len(ids["select"])  # evaluations during training: the slice, not the fold
    again = build(cfg, ("train", "validation", "select"))  # seeded (data.fold_seed): the same slice
    assert {ex["id"] for ex in again.splits["select"].examples} == ids["select"]


@pytest.mark.parametrize("settings,error", [
    (["data.fold_selection=inner", "train.select_best=false"], "data.fold_selection=inner holds out a slice of the "
                                                                "training folds to select the checkpoint on: it needs "
                                                                "train.select_best=true"),
    (["data.folds=null", "data.fold=null", "data.fold_selection=inner"], "data.fold_selection=inner selects a "
                                                                          "cross-validation fold's checkpoint"),
    (["data.fold_selection=outer"], "data.fold_selection=outer: expected fold"),
])
def test_fold_selection_mistakes_are_one_line_errors(run_job, settings, error):
    res = run_job([*SAMPLE_CV, *settings])
    assert res["status"] == "failed" and "\n" not in res["error"] and error in res["error"], res["error"]


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
