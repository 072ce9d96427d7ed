"""Data options every task honours the same way: ``data.<role>_column`` names a local file's columns
for every task (a task without that column refuses it), and files given explicitly and
``data.validation_split`` win over a data preset's files."""
from __future__ import annotations

import json

import pytest

from conftest import compose, shared_path
from kotune.core.errors import ConfigError

LABELS = ("entailment", "neutral", "contradiction")


def splits(overrides: list[str], need=("train", "validation"), seed: int = 42):
    from tasks import build_task
    from tasks.splits import load_splits

    cfg = compose(overrides)
    return load_splits(build_task(cfg.task), cfg.data, need, seed)


def nli_file(tmp_path, keys=("guid", "premise", "hypothesis", "gold_label"), premises: int = 40) -> str:
    """KLUE NLI's layout (three hypotheses per premise, one per label), under the given field names."""
    rows = [dict(zip(keys, (f"own-{p}-{label}", f"전제 {p}", f"가설 {p} {label}", label)))
            for p in range(premises) for label in LABELS]
    path = tmp_path / "nli.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    return str(path)


# ---- issue 22.4: a preset's files never override what is given --------------------------------------
def test_sample_preset_holds_out_the_given_train_file_not_its_own_dev(tmp_path):
    """data=sample data.train_file=F data.validation_split=0.2 used to evaluate on the 21 sample rows."""
    out = splits(["task=nli", "data=sample", f"data.train_file={nli_file(tmp_path)}", "data.validation_split=0.2"])
    assert (len(out["train"].examples), len(out["validation"].examples)) == (96, 24)
    assert all(ex["id"].startswith("own-") for ex in out["validation"].examples)
    assert out["validation"].source["part"] == "held-out"


def test_sample_preset_split_holds_out_part_of_the_sample_train_file():
    from tasks.splits import sample_file

    out = splits(["task=nli", "data=sample", "data.validation_split=0.25"])
    train_file = sample_file(compose(["task=nli"]).task, "train")
    assert out["validation"].source["file"] == out["train"].source["file"] == train_file
    assert len(out["train"].examples) + len(out["validation"].examples) == 81  # the sample train rows


def test_sample_preset_fills_in_only_the_file_not_given(tmp_path):
    out = splits(["task=nli", "data=sample", f"data.train_file={nli_file(tmp_path)}"])
    assert len(out["train"].examples) == 120
    assert out["validation"].source["file"].endswith("samples/nli/dev.json")


def test_a_validation_file_and_a_split_together_is_an_error():
    """data=hate_speech names its dev file: a split on top of it would be silently ignored."""
    with pytest.raises(ConfigError, match=r"data\.validation_split=0\.2 and data\.validation_file=\S+dev\.tsv "
                                          r"are both set: keep one \(data\.validation_file=null"):
        splits(["task=text_cls", "data=hate_speech", "data.validation_split=0.2"])


@pytest.mark.parametrize("option", ["data.validation_split=0.2", "data.label_column=gold"])
def test_file_options_with_hub_data_are_an_error_not_ignored(option):
    with pytest.raises(ConfigError, match=rf"{option} applies to local files, but klue/klue \(nli\) is read "
                                          r"from the hub with its own columns and splits: add data\.train_file="):
        splits(["task=nli", option])  # refused before the hub is asked (offline: no network wait)


# ---- issue 22.10: one way to name columns, for every task ---------------------------------------------
def test_korsts_reads_with_data_label_column():
    """KorSTS's own TSV: sentence1/sentence2 match task=sts's defaults, its label column is `score`."""
    path = shared_path("data/korsts/sts-train.tsv")
    out = splits(["task=sts", f"data.train_file={path}", "data.label_column=score", "data.validation_split=0.2"])
    examples = out["train"].examples + out["validation"].examples
    assert len(examples) == 5749
    assert all(0.0 <= ex["label"] <= 5.0 for ex in examples)
    assert ("비행기가 이륙하고 있다.", 5.0) in {(ex["text"], ex["label"]) for ex in examples}  # row 1


def test_data_columns_rename_a_klue_tasks_columns(tmp_path):
    keys = ("pair_id", "first", "second", "gold")
    out = splits(["task=nli", f"data.train_file={nli_file(tmp_path, keys)}", "data.validation_split=0.2",
                  "data.id_column=pair_id", "data.text_column=first", "data.text_pair_column=second",
                  "data.label_column=gold"])
    ex = out["train"].examples[0]
    assert ex["id"].startswith("own-") and ex["text"].startswith("전제") and ex["text_pair"].startswith("가설")
    assert {e["label"] for e in out["train"].examples} == set(LABELS)


def test_sts_label_column_on_a_fixture(tmp_path):
    path = tmp_path / "sts.tsv"
    rows = "".join(f"{i}\t문장 {i}\t다른 문장 {i}\t{i % 6}.0\n" for i in range(10))
    path.write_text("id\tsentence1\tsentence2\tscore\n" + rows, encoding="utf-8")
    out = splits(["task=sts", f"data.train_file={path}", "data.validation_split=0.2", "data.label_column=score",
                  "data.id_column=id"])
    examples = out["train"].examples + out["validation"].examples
    assert sorted(ex["label"] for ex in examples) == sorted(float(i % 6) for i in range(10))
    assert {ex["id"] for ex in examples} == {str(i) for i in range(10)}


def test_a_missing_column_names_the_data_option_for_klue_tasks_too(tmp_path):
    from kotune.core.errors import DataError

    with pytest.raises(DataError, match=r"has no column 'labels\.real-label' \(columns: id, sentence1, sentence2, "
                                        r"score; set data\.label_column=\)"):
        path = tmp_path / "sts.tsv"
        path.write_text("id\tsentence1\tsentence2\tscore\n1\t가\t나\t3.0\n2\t다\t라\t1.0\n", encoding="utf-8")
        splits(["task=sts", f"data.train_file={path}", "data.validation_split=0.5"])


@pytest.mark.parametrize("task,option,reads", [
    ("ner", "data.label_column=tag", "its file format fixes its fields"),
    ("korquad", "data.text_column=context", "its file format fixes its fields"),
    ("token_cls", "data.text_column=word", "it reads task.columns.token, task.columns.tag"),
    ("text_cls", "data.text_pair_column=b",
     "it reads data.id_column, data.text_column, data.label_column, data.group_column"),
])
def test_a_column_setting_the_task_does_not_read_is_an_error(task, option, reads, tmp_path):
    files = [f"data.train_file={tmp_path}/a.txt", f"data.validation_file={tmp_path}/b.txt"]  # never read
    role = option.split(".")[1].split("=")[0][: -len("_column")]
    with pytest.raises(ConfigError, match=rf"^{option}: task {task} has no {role} column \({reads}\)$"):
        splits([f"task={task}", option, *files])
