"""A newcomer's own files: a ``sentence,label`` CSV trains with no column settings, the checkpoint then
predicts, evaluates and embeds given only ``checkpoint=`` (its task, columns and model; filed
under its task and model), predictions are readable (the text, each label's probability; a
tagger's words and entities), and the usual mistakes — an ambiguous header, a header without
rows, a misspelled key — are one line each."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import ROOT, compose, run_cli

SAMPLES = ROOT / "tasks" / "samples"
TRAIN = ["model=tiny", "train.max_steps=4", "train.batch_size=16", "train.learning_rate=1e-3"]


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def sample_rows(split: str) -> list[list[str]]:
    """(text, label) rows of the text_cls sample (a TSV with a header)."""
    lines = (SAMPLES / "text_cls" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t") for line in lines if line.strip()]


def job(overrides: list[str], run_dir: Path, cache_dir: str) -> dict:
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    return execute(compose(overrides + [f"cache_dir={cache_dir}"]), str(run_dir))


@pytest.fixture(scope="module")
def own_csv(tmp_path_factory, cache_dir) -> dict:
    """A run_glue-style ``sentence,label`` CSV trained with ``task=text_cls`` and no column settings."""
    root = tmp_path_factory.mktemp("own-csv")
    train = write_csv(root / "train.csv", ["sentence", "label"], sample_rows("train"))
    dev = write_csv(root / "dev.csv", ["sentence", "label"], sample_rows("dev"))
    unlabelled = write_csv(root / "unl.csv", ["sentence"], [[text] for text, _ in sample_rows("dev")])
    res = job(["task=text_cls", *TRAIN, f"data.train_file={train}", f"data.validation_file={dev}"],
              root / "run", cache_dir)
    assert res["status"] == "ok", res.get("error")
    return {"root": root, "run": root / "run", "res": res, "dev": dev, "unlabelled": unlabelled, "cache": cache_dir}


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def test_a_sentence_label_csv_is_read_by_the_conventional_column(own_csv):
    saved = json.loads((own_csv["run"] / "model" / "kotune.json").read_text(encoding="utf-8"))["meta"]
    assert saved["columns"]["text"] == "sentence" and saved["task"] == "text_cls" and saved["model"] == "tiny"
    assert [r["text"] for r in records(own_csv["run"])] == [text for text, _ in sample_rows("dev")]


def test_classification_predictions_carry_the_text_and_each_labels_probability(own_csv):
    labels = json.loads((own_csv["run"] / "model" / "kotune.json").read_text(encoding="utf-8"))["meta"]["labels"]
    for rec, (text, gold) in zip(records(own_csv["run"]), sample_rows("dev")):
        assert (rec["text"], rec["gold"]) == (text, gold)
        assert list(rec["probabilities"]) == labels
        assert sum(rec["probabilities"].values()) == pytest.approx(1.0, abs=len(labels) * 5e-5)  # 4-digit rounding
        assert rec["prediction"] == max(rec["probabilities"], key=rec["probabilities"].get)


def test_predict_from_the_command_line_needs_only_the_checkpoint(own_csv, tmp_path):
    """No task=, no column setting: the checkpoint's text_cls, 'sentence' column and tiny model; the run
    is filed under outputs/text_cls/tiny/, and its predictions equal the training run's."""
    proc = run_cli(["action=predict", f"checkpoint={own_csv['run']}", f"data.predict_file={own_csv['unlabelled']}",
                    f"cache_dir={own_csv['cache']}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [results] = list((tmp_path / "outputs" / "text_cls" / "tiny" / "finetune").glob("*/results.json"))
    res = json.loads(results.read_text(encoding="utf-8"))
    assert (res["task"], res["model"], res["status"]) == ("text_cls", "tiny", "ok")
    without_gold = [{k: v for k, v in r.items() if k not in ("gold", "id")} for r in records(own_csv["run"])]
    assert [{k: v for k, v in r.items() if k != "id"} for r in records(results.parent)] == without_gold


def test_eval_and_embed_take_the_checkpoints_task_and_columns(own_csv):
    evaluated = job(["action=eval", f"checkpoint={own_csv['run']}", f"data.validation_file={own_csv['dev']}"],
                    own_csv["root"] / "eval", own_csv["cache"])
    assert evaluated["status"] == "ok", evaluated.get("error")
    assert (evaluated["task"], evaluated["model"]) == ("text_cls", "tiny")
    assert evaluated["metrics"] == pytest.approx(own_csv["res"]["metrics"], abs=1e-9)
    embedded = job(["action=embed", f"checkpoint={own_csv['run']}", f"embed.input={own_csv['unlabelled']}"],
                   own_csv["root"] / "embed", own_csv["cache"])
    assert embedded["status"] == "ok", embedded.get("error")
    assert embedded["n_texts"] == len(sample_rows("dev"))


def test_an_override_the_weights_cannot_serve_is_one_line_naming_it(own_csv):
    res = job(["action=predict", "task=text_pair", f"checkpoint={own_csv['run']}",
               f"data.predict_file={own_csv['unlabelled']}"], own_csv["root"] / "wrong", own_csv["cache"])
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert res["error"].startswith("task=text_pair: checkpoint") and "task=text_cls" in res["error"]


def test_a_checkpoint_without_the_new_records_still_loads(own_csv, tmp_path):
    """A kotune.json written before columns were saved: its task and model still apply, and the
    task's default columns (the file then names its column)."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(own_csv["run"] / "model", old / "model")
    spec = json.loads((old / "model" / "kotune.json").read_text(encoding="utf-8"))
    del spec["meta"]["columns"]
    del spec["manifest"]  # written before manifests too (kotune/core/atomic_dir.py)
    (old / "model" / "kotune_manifest.json").unlink()
    (old / "model" / "kotune.json").write_text(json.dumps(spec), encoding="utf-8")
    res = job(["action=predict", f"checkpoint={old}", f"data.predict_file={own_csv['unlabelled']}"],
              tmp_path / "predict", own_csv["cache"])
    assert res["status"] == "ok", res.get("error")
    assert res["task"] == "text_cls" and res["n_predict"] == len(sample_rows("dev"))


# ---- columns, empty files, keys (no training) ---------------------------------------------------
def read(task: str, path: Path, overrides: list[str] = (), holdout: bool = False) -> list[dict]:
    """The examples of ``path`` read as the training file (``holdout``: half of it held out)."""
    from tasks import build_task
    from tasks.splits import load_splits

    split = ["data.validation_split=0.5"] if holdout else [f"data.validation_file={path}"]
    cfg = compose([f"task={task}", f"data.train_file={path}", *split, *overrides])
    return load_splits(build_task(cfg.task), cfg.data, ("train", "validation"), 0)["train"].examples


@pytest.mark.parametrize("task,header,fields", [
    ("text_cls", ["document", "label"], ("text",)),
    ("text_pair", ["sentence1", "sentence2", "label"], ("text", "text_pair")),
    ("text_pair", ["premise", "hypothesis", "label"], ("text", "text_pair")),
])
def test_conventional_column_names_are_read_when_one_fits(task, header, fields, tmp_path):
    rows = [[f"{name} {i}" for name in header[:-1]] + ["a" if i % 2 else "b"] for i in range(6)]
    examples = read(task, write_csv(tmp_path / "f.csv", header, rows))
    assert [[ex[field] for field in fields] + [ex["label"]] for ex in examples] == rows


def test_two_conventional_names_are_an_error_naming_the_setting(tmp_path):
    from kotune.core.errors import DataError

    path = write_csv(tmp_path / "f.csv", ["sentence", "document", "label"], [["x", "y", "a"], ["z", "w", "b"]])
    with pytest.raises(DataError) as err:
        read("text_cls", path)
    assert str(err.value) == (f"{path}: has no column 'text' and could be read as sentence or document: "
                              "set data.text_column=")
    assert read("text_cls", path, ["data.text_column=document"])[0]["text"] in ("y", "w")


def test_an_explicit_column_is_never_replaced_by_a_conventional_one(tmp_path):
    from kotune.core.errors import DataError

    path = write_csv(tmp_path / "f.csv", ["sentence", "label"], [["x", "a"], ["y", "b"]])
    with pytest.raises(DataError, match="has no column 'body'"):
        read("text_cls", path, ["data.text_column=body"])


def test_a_header_without_rows_says_no_rows(tmp_path):
    from kotune.core.errors import DataError

    path = write_csv(tmp_path / "empty.csv", ["sentence", "label"], [])
    with pytest.raises(DataError) as err:
        read("text_cls", path, holdout=True)  # was: "the rows form 0 group(s), too few to hold some out"
    assert str(err.value) == f"{path}: no rows (the file holds no examples)"


@pytest.mark.parametrize("argv,line", [
    (["task=text_cls", "data.text_colum=sentence"],
     "data.text_colum is not a config key (did you mean data.text_column?)"),
    (["task=nli", "task.join=x"],
     "task.join is not a key of task nli (task ner, token_cls have it: choose one with task=)"),
    (["task=text_cls", "data.text_column=sentence", "+data.extra=1", "model.config_overrides.hidden_size=64"], None),
])
def test_a_key_the_config_lacks_is_one_line_naming_the_closest(argv, line):
    from kotune.cli.overrides import bad_override, job_overrides

    assert bad_override(job_overrides(argv)) == line


# ---- tagger output -------------------------------------------------------------------------------
def test_predicted_entities_group_tags_as_the_simple_pipeline_does():
    from tasks.tagging import predicted_entities

    words = ["김", "교수는", "한빛", "전자", "에서", "일한다"]
    assert predicted_entities(words, " ", ["B-PER", "O", "B-ORG", "I-ORG", "O", "I-LOC"]) == [
        {"type": "PER", "text": "김", "start": 0, "end": 1},
        {"type": "ORG", "text": "한빛 전자", "start": 6, "end": 11},
        {"type": "LOC", "text": "일한다", "start": 15, "end": 18}]  # an I- after O starts one, as the pipeline's
    chars = list("서울 시청")  # KLUE NER: characters, the space a unit too
    assert predicted_entities(chars, "", ["B-LOC", "I-LOC", "I-LOC", "B-ORG", "I-ORG"]) == [
        {"type": "LOC", "text": "서울", "start": 0, "end": 2}, {"type": "ORG", "text": "시청", "start": 3, "end": 5}]


def test_the_checkpoints_presets_and_task_options_come_first_and_the_users_win(tmp_path):
    """A character tagger trained frozen: its task, model, mode and options are put before the user's
    overrides; a task option or preset the user names is theirs (a conflict is then build's one line)."""
    from kotune.cli.checkpoint_overrides import checkpoint_overrides

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "kotune.json").write_text(json.dumps({"head": "token_char", "frozen": True, "meta": {
        "task": "token_cls", "model": "tiny", "task_options": {"decode": "char", "join": "", "scheme": "iobes",
                                                                "label_subwords": None}}}), encoding="utf-8")
    given = [f"checkpoint={tmp_path}", "action=predict"]
    assert checkpoint_overrides(given) == ["task=token_cls", "model=tiny", "mode=frozen", "++task.decode='char'",
                                           "++task.join=''", "++task.scheme='iobes'", *given]
    cfg = compose(given)
    assert (cfg.task.name, cfg.task.decode, cfg.task.join, cfg.model.name, cfg.mode.name) == \
        ("token_cls", "char", "", "tiny", "frozen")
    mine = [*given, "model=klue", "task.decode=subword"]
    assert checkpoint_overrides(mine) == ["task=token_cls", "mode=frozen", "++task.join=''", "++task.scheme='iobes'",
                                          *mine]
    assert checkpoint_overrides([*given, "task=ner"]) == ["model=tiny", "mode=frozen", *given, "task=ner"]
