"""action=label_issues (cleanlab on out-of-fold probabilities) and data.exclude_ids: a 3-fold run of
the text_cls sample with labels flipped on purpose, the ranked issues file it gives, one-line
refusals for what is not one complete k-fold run, and the training split without the listed rows;
the token_cls sample's 3-fold run with task.unit_probabilities=true and a few tags flipped (the
sentences with their given and suggested tags), refused without the option."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, compose, run_cli
from omegaconf import OmegaConf

SAMPLE = ROOT / "tasks" / "samples" / "text_cls" / "train.tsv"
FLIPPED = [3, 10, 17, 24, 31, 38]  # data rows (1-based, after the header) whose label is changed


def flipped_copy(folder: Path) -> Path:
    """The sample's training file with the rows of FLIPPED given the next label in turn."""
    with open(SAMPLE, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    labels = sorted({r[1] for r in rows[1:]})
    for n in FLIPPED:
        rows[n][1] = labels[(labels.index(rows[n][1]) + 1) % len(labels)]
    path = folder / "train.tsv"
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory, cache_dir):
    """A 3-fold multirun on the flipped copy: (its directory, the training file)."""
    folder = tmp_path_factory.mktemp("label_issues")
    train = flipped_copy(folder)
    sweep = folder / "cv"
    proc = run_cli(["-m", "task=text_cls", "model=tiny", "data=sample", f"data.train_file={train}", "data.folds=3",
                    "data.fold=0,1,2", "train.max_steps=20", "train.batch_size=16", "save_model=false",
                    f"cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sweep, train


def file_labels(path: Path) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    return {f"{path.name}:{i}": r[1] for i, r in enumerate(rows, 2)}


def test_the_issues_file_ranks_rows_with_given_and_suggested_labels(run_job, tmp_path, cv_run):
    sweep, train = cv_run
    res = run_job(["action=label_issues", f"label_issues.runs={sweep}"], "issues")
    assert res["status"] == "ok", res.get("error")
    assert res["task"] == "text_cls" and res["model"] == "tiny"
    summary = res["label_issues"]
    given = file_labels(train)
    assert summary["n_rows"] == len(given) == 80 and summary["folds"] == 3
    rows = [json.loads(line) for line in (tmp_path / "issues" / "label_issues.jsonl").read_text().splitlines()]
    with open(tmp_path / "issues" / "label_issues.csv", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert summary["n_issues"] == len(rows) == len(table) > 0
    assert [r["id"] for r in table] == [r["id"] for r in rows]
    assert (tmp_path / "issues" / "label_issues.ids").read_text().split() == [r["id"] for r in rows]
    labels = set(given.values())
    scores = [r["label_quality"] for r in rows]
    assert scores == sorted(scores) and all(0 <= s <= 1 for s in scores)
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        assert r["given_label"] == given[r["id"]] and r["suggested_label"] in labels
        assert r["given_probability"] == pytest.approx(r["label_quality"], abs=1e-4)  # self-confidence
        assert r["fold"] in (0, 1, 2) and r["text"]
    assert set(summary["per_class"]) == labels
    assert sum(c["n"] for c in summary["per_class"].values()) == 80
    assert res["data"]["train"]["file"] == str(train)

    # the same out-of-fold predictions given as one file (label_issues.predictions), with the folds'
    # full-precision probabilities beside it as a run writes them: the same rows
    merged = tmp_path / "oof" / "predictions.jsonl"
    merged.parent.mkdir()
    merged.write_text("".join(p.read_text() for p in sorted(sweep.rglob("predictions.jsonl"))))
    exact = [json.loads(p.read_text()) for p in sorted(sweep.rglob("probabilities.json"))]
    assert len(exact) == 3
    (merged.parent / "probabilities.json").write_text(json.dumps(
        {"labels": exact[0]["labels"], "rows": {k: v for e in exact for k, v in e["rows"].items()}}))
    again = run_job(["action=label_issues", "task=text_cls", f"label_issues.predictions={merged}",
                     f"data.train_file={train}"], "from_file")
    assert again["status"] == "ok", again.get("error")
    assert [json.loads(line)["id"] for line in (tmp_path / "from_file" / "label_issues.jsonl").read_text().splitlines()] \
        == [r["id"] for r in rows]
    # the probabilities cleanlab read are the runs' unrounded ones (predictions.jsonl shows 4 digits)
    full = {k: dict(zip(exact[0]["labels"], v)) for e in exact for k, v in e["rows"].items()}
    assert all(r["given_probability"] == pytest.approx(full[r["id"]][r["given_label"]], abs=6e-7) for r in rows)


def sample_examples() -> tuple[list[dict], dict[str, str]]:
    """The flipped sample's rows as label_issues reads them (id ``train.tsv:LINE``), and each row's
    original label."""
    with open(SAMPLE, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    labels = sorted({r[1] for r in rows[1:]})
    original = {f"train.tsv:{n + 1}": rows[n][1] for n in range(1, len(rows))}
    examples = [{"id": f"train.tsv:{n + 1}", "text": rows[n][0],
                 "label": labels[(labels.index(rows[n][1]) + 1) % 3] if n in FLIPPED else rows[n][1]}
                for n in range(1, len(rows))]
    return examples, original


def test_the_flipped_rows_are_the_rows_flagged_when_the_model_knows_the_labels():
    """Out-of-fold probabilities of a model that learned the original labels (0.8 on it, a little
    spread): the rows whose label was flipped on purpose are exactly those flagged, each with its
    original label suggested. (The 3-fold tiny runs above are near chance on 80 rows: they flag most rows.)"""
    from kotune.reporting.label_issues import find_issues
    from tasks import build_task

    examples, original = sample_examples()
    labels = sorted(set(original.values()))
    records = {}
    for i, ex in enumerate(examples):
        top = 0.8 - 0.001 * (i % 7)
        records[ex["id"]] = {"probabilities": {k: top if k == original[ex["id"]] else (1 - top) / 2 for k in labels}}
    found = find_issues(build_task(compose(["task=text_cls"]).task), examples, records, "oof")
    flipped = {f"train.tsv:{n + 1}" for n in FLIPPED}
    assert {r["id"] for r in found["rows"]} == flipped
    assert all(r["suggested_label"] == original[r["id"]] != r["given_label"] for r in found["rows"])


def test_a_runs_exact_probabilities_replace_the_rounded_ones_and_a_stale_file_is_refused(tmp_path):
    """probabilities.json beside predictions.jsonl: read back in place of the rounded values, each
    checked to round to what predictions.jsonl shows (another run's file is refused in one line)."""
    from kotune.actions.label_issues import with_exact_probabilities
    from kotune.core.errors import DataError

    def records() -> dict:
        return {"a": {"id": "a", "probabilities": {"x": 0.3333, "y": 0.6667}},
                "b": {"id": "b", "probabilities": {"x": 0.3333, "y": 0.6667}}}

    assert with_exact_probabilities(records(), tmp_path) == records()  # no file: as they are
    exact = {"labels": ["x", "y"], "rows": {"a": [0.33334, 0.66666], "b": [0.33326, 0.66674]}}
    (tmp_path / "probabilities.json").write_text(json.dumps(exact))
    got = with_exact_probabilities(records(), tmp_path)
    assert got["a"]["probabilities"] == {"x": 0.33334, "y": 0.66666} and got["b"]["probabilities"]["x"] == 0.33326
    for rows, error in [({"a": [0.5, 0.5], "b": [0.33326, 0.66674]}, "probabilities.json:a: 'x': 0.5 is not predictions.jsonl's 0.3333"),
                        ({"a": [0.33334, 0.66666]}, "probabilities.json:b: its rows are not predictions.jsonl's"),
                        ({"a": [0.33334], "b": [0.33326, 0.66674]}, "probabilities.json:a: not one probability per label"),
                        ({"a": [0.33334, "high"], "b": [0.33326, 0.66674]}, "probabilities.json:a: 'y': 'high' is not a probability")]:
        (tmp_path / "probabilities.json").write_text(json.dumps({"labels": ["x", "y"], "rows": rows}))
        with pytest.raises(DataError) as e:
            with_exact_probabilities(records(), tmp_path)
        assert error in str(e.value) and "\n" not in str(e.value)


def test_multi_label_issues_list_label_sets(run_job, tmp_path, cache_dir):
    sweep = tmp_path / "cv"
    proc = run_cli(["-m", "task=multi_label", "model=tiny", "data=sample", "data.folds=3", "data.fold=0,1,2",
                    "train.max_steps=4", "train.batch_size=16", "save_model=false", f"cache_dir={cache_dir}",
                    f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = run_job(["action=label_issues", f"label_issues.runs={sweep}"], "issues")
    assert res["status"] == "ok", res.get("error")
    summary = res["label_issues"]
    assert summary["kind"] == "multi-label" and summary["n_rows"] == 64
    rows = [json.loads(line) for line in (tmp_path / "issues" / "label_issues.jsonl").read_text().splitlines()]
    assert len(rows) == summary["n_issues"]
    assert [r["label_quality"] for r in rows] == sorted(r["label_quality"] for r in rows)
    labels = set(summary["per_class"])
    assert all(isinstance(r["given_label"], list) and set(r["given_label"]) <= labels
               and set(r["suggested_label"]) <= labels for r in rows)


def broken(sweep: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "cv"
    shutil.copytree(sweep, copy)
    runs = sorted(copy.rglob("results.json"))
    if how == "missing fold":
        shutil.rmtree(runs[2].parent)
    elif how == "failed fold":
        res = json.loads(runs[1].read_text())
        runs[1].write_text(json.dumps(dict(res, status="failed")))
    elif how == "no predictions":
        (runs[0].parent / "predictions.jsonl").unlink()
    elif how == "other settings":
        res = json.loads(runs[1].read_text())
        res["config"]["train"]["lr"] = 0.5
        runs[1].write_text(json.dumps(res))
    elif how == "fold twice":
        shutil.copytree(runs[0].parent, copy / "again")
    elif how == "rows missing":  # a fold's predictions lose a row: the folds no longer cover the file
        path = runs[0].parent / "predictions.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[1:]))
        exact = runs[0].parent / "probabilities.json"  # its full-precision twin loses the same row
        if exact.exists():
            data = json.loads(exact.read_text())
            data["rows"].pop(str(json.loads(lines[0])["id"]))
            exact.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("how,error", [
    ("missing fold", "the 3-fold cross-validation lacks fold(s) 2"),
    ("failed fold", "'s run"),
    ("no predictions", "wrote no predictions.jsonl"),
    ("other settings", "the runs differ in more than data.fold (train.lr"),
    ("fold twice", "fold(s) 0 ran more than once"),
    ("rows missing", "1 of 80 training rows have no out-of-fold prediction"),
])
def test_what_is_not_one_complete_k_fold_run_is_refused_in_one_line(run_job, tmp_path, cv_run, how, error):
    res = run_job(["action=label_issues", f"label_issues.runs={broken(cv_run[0], tmp_path, how)}"], "refused")
    assert res["status"] == "failed" and error in res["error"] and "\n" not in res["error"], res.get("error")


def test_a_plain_run_or_no_runs_are_refused_in_one_line(run_job, tmp_path):
    plain = run_job(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1", "save_model=false"], "plain")
    assert plain["status"] == "ok", plain.get("error")
    for args, error in ((["label_issues.runs=" + str(tmp_path / "plain")], "is not a cross-validation fold's training run"),
                        (["label_issues.runs=" + str(tmp_path / "nowhere")], "no such directory"),
                        ([], "needs one of label_issues.runs=DIR")):
        res = run_job(["action=label_issues", *args], "refused")
        assert res["status"] == "failed" and error in res["error"] and "\n" not in res["error"], res.get("error")


def fold_splits(train: Path, extra: dict):
    from tasks import build_task
    from tasks.splits import load_splits

    task = build_task(compose(["task=text_cls"]).task)
    data = OmegaConf.create({"train_file": str(train), "folds": 3, "fold": 0, **extra})
    return load_splits(task, data, ("train", "validation"), seed=1)


def test_exclude_ids_leaves_exactly_those_rows_out_of_training(run_job, tmp_path):
    train = flipped_copy(tmp_path)
    plain = fold_splits(train, {})
    in_train = [ex["id"] for ex in plain["train"].examples]
    in_fold = [ex["id"] for ex in plain["validation"].examples]
    listed = in_train[:4] + in_fold[:1]  # a row of the validation fold stays there: training split only
    ids = tmp_path / "drop.txt"
    ids.write_text("# flagged by label_issues\n" + "\n".join(listed) + "\n\n")
    cut = fold_splits(train, {"exclude_ids": str(ids)})
    assert [ex["id"] for ex in cut["train"].examples] == in_train[4:]
    assert [ex["id"] for ex in cut["validation"].examples] == in_fold
    assert cut["train"].source["exclude_ids"]["removed"] == 4 and cut["train"].source["exclude_ids"]["listed"] == 5

    res = run_job(["task=text_cls", "model=tiny", "data=sample", f"data.train_file={train}", "data.folds=3",
                   "data.fold=0", "train.max_steps=1", "save_model=false", f"data.exclude_ids={ids}"], "cut")
    assert res["status"] == "ok", res.get("error")
    assert res["n_train"] == len(in_train) - 4 and res["n_eval"] == len(in_fold)
    assert res["data"]["train"]["exclude_ids"]["removed"] == 4


@pytest.mark.parametrize("content,error", [
    (None, "data.exclude_ids: file not found"),
    ("\n# nothing\n", "the file lists no ids"),
    ("train.tsv:2\ntrain.tsv:2\n", "id 'train.tsv:2' is listed twice"),
    ("train.tsv:2\nnope\nnope2\n", "2 id(s) are not rows of the training file"),
])
def test_bad_ids_files_are_refused_in_one_line(tmp_path, content, error):
    from kotune.core.errors import KotuneError

    train = flipped_copy(tmp_path)
    ids = tmp_path / "ids.txt"
    if content is not None:
        ids.write_text(content)
    with pytest.raises(KotuneError) as e:
        fold_splits(train, {"exclude_ids": str(ids)})
    assert error in str(e.value) and "\n" not in str(e.value)


# ---- token tasks (NER, token_cls): cleanlab's token_classification on per-unit probabilities ----
TOKEN_SAMPLE = ROOT / "tasks" / "samples" / "token_cls" / "train.conll"
TOKEN_FLIPPED = [2, 9, 16, 23, 30, 37, 44]  # sentences (0-based) whose first single-word PER/LOC changes type


def token_flipped_copy(folder: Path) -> tuple[Path, dict[str, tuple[int, str, str]]]:
    """The token_cls sample with, in the sentences of TOKEN_FLIPPED, the first B-PER or B-LOC not
    followed by I- turned into the other: (the file, id → (unit, given tag, original tag))."""
    blocks = TOKEN_SAMPLE.read_text(encoding="utf-8").strip("\n").split("\n\n")
    flipped, line = {}, 1
    for s, block in enumerate(blocks):
        rows = [r.split("\t") for r in block.split("\n")]
        if s in TOKEN_FLIPPED:
            for k, (_, tag) in enumerate(rows):
                after = rows[k + 1][1] if k + 1 < len(rows) else "O"
                if tag in ("B-PER", "B-LOC") and not after.startswith("I-"):
                    rows[k][1] = "B-LOC" if tag == "B-PER" else "B-PER"
                    flipped[f"train.conll:{line}"] = (k, rows[k][1], tag)
                    break
        blocks[s] = "\n".join("\t".join(r) for r in rows)
        line += len(rows) + 1
    path = folder / "train.conll"
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path, flipped


def token_cv(folder: Path, cache_dir: str, *extra: str) -> tuple[Path, dict]:
    train, flipped = token_flipped_copy(folder)
    sweep = folder / "cv"
    proc = run_cli(["-m", "task=token_cls", "model=tiny", "data=sample", f"data.train_file={train}", "data.folds=3",
                    "data.fold=0,1,2", "train.max_steps=30", "train.batch_size=16", "train.learning_rate=1e-3",
                    "save_model=false", f"cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}", *extra])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sweep, flipped


def test_token_issues_list_sentences_with_given_and_suggested_tags(run_job, tmp_path, cache_dir):
    sweep, flipped = token_cv(tmp_path, cache_dir, "task.unit_probabilities=true")
    preds = [json.loads(line) for p in sorted(sweep.rglob("predictions.jsonl")) for line in p.read_text().splitlines()]
    for rec in preds:
        probs = rec["unit_probabilities"]
        assert len(probs["units"]) == len(rec["units"]) == len(rec["prediction"])
        for unit, p in zip(rec["prediction"], probs["units"]):  # a word's first subword decides its tag
            assert p is not None and sum(p) == pytest.approx(1, abs=1e-3) and probs["tags"][p.index(max(p))] == unit
    res = run_job(["action=label_issues", f"label_issues.runs={sweep}"], "issues")
    assert res["status"] == "ok", res.get("error")
    summary = res["label_issues"]
    assert summary["kind"] == "token" and summary["n_rows"] == len(preds) and summary["folds"] == 3
    assert summary["n_units"] == sum(len(r["units"]) for r in preds) and summary["n_unit_issues"] > 0
    assert set(summary["per_class"]) <= {"B-LOC", "B-ORG", "B-PER", "I-ORG", "O"}
    rows = [json.loads(line) for line in (tmp_path / "issues" / "label_issues.jsonl").read_text().splitlines()]
    with open(tmp_path / "issues" / "label_issues.csv", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert summary["n_issues"] == len(rows) == len(table) > 0
    assert [r["id"] for r in table] == [r["id"] for r in rows]
    assert table[0]["given_tags"] == "|".join(rows[0]["given_tags"])
    scores = [r["label_quality"] for r in rows]
    assert scores == sorted(scores) and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    given = {rec["id"]: rec["gold"] for rec in preds}
    for r in rows:
        assert r["units"] and r["text"] and r["fold"] in (0, 1, 2)
        assert len(r["positions"]) == len(r["tokens"]) == len(r["given_tags"]) == len(r["suggested_tags"]) > 0
        assert [r["units"][k] for k in r["positions"]] == r["tokens"]
        assert [given[r["id"]][k] for k in r["positions"]] == r["given_tags"]
        assert min(r["token_quality"]) == pytest.approx(r["label_quality"], abs=1e-6)  # the sentence: its worst unit
    # the flipped tags are among those listed, with the original tag suggested for at least one
    listed = {(r["id"], k): s for r in rows for k, s in zip(r["positions"], r["suggested_tags"])}
    found = [listed[(i, k)] == orig for i, (k, _, orig) in flipped.items() if (i, k) in listed]
    assert len(flipped) == len(TOKEN_FLIPPED) and sum(found) >= len(flipped) // 2, (flipped, rows[:3])


def test_token_runs_without_unit_probabilities_are_refused_in_one_line(run_job, tmp_path, cache_dir):
    sweep, _ = token_cv(tmp_path, cache_dir, "train.max_steps=2")
    records = [json.loads(line) for p in sweep.rglob("predictions.jsonl") for line in p.read_text().splitlines()]
    assert records and not any("unit_probabilities" in r for r in records)  # off by default: records unchanged
    res = run_job(["action=label_issues", f"label_issues.runs={sweep}"], "refused")
    assert res["status"] == "failed" and "rerun the k-fold multirun with task.unit_probabilities=true" in res["error"]
    assert "\n" not in res["error"]


def test_unit_probabilities_with_a_crf_are_refused_in_one_line():
    from kotune.core.errors import ConfigError
    from tasks import build_task

    with pytest.raises(ConfigError) as e:
        build_task(compose(["task=token_cls", "task.crf=true", "task.unit_probabilities=true"]).task)
    assert "Viterbi" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError):  # a classification task has no such option
        build_task(compose(["task=text_cls", "+task.unit_probabilities=true"]).task)


def test_klue_characters_inside_a_token_carry_its_probabilities(run_job, tmp_path):
    res = run_job(["task=ner", "model=tiny", "data=sample", "train.max_steps=2", "save_model=false",
                   "task.unit_probabilities=true"], "ner")
    assert res["status"] == "ok", res.get("error")
    records = [json.loads(line) for line in (tmp_path / "ner" / "predictions.jsonl").read_text().splitlines()]
    inner = 0
    for rec in records:
        tags, units = rec["unit_probabilities"]["tags"], rec["unit_probabilities"]["units"]
        assert len(units) == len(rec["units"])
        for char, decided, p in zip(rec["units"], rec["prediction"], units):
            if char.isspace():
                assert p is None  # no token covers a space: left out of label_issues
            elif p is not None:
                assert sum(p) == pytest.approx(1, abs=1e-3) and p[tags.index(decided)] > 0
                if all(v == 0 for t, v in zip(tags, p) if t.startswith("B-")):  # a character inside a token
                    inner += 1  # its token's B-X mass moved to I-X: its decided tag continues the token's
                    assert not decided.startswith("B-")
    assert inner > 0
