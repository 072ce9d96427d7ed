"""``action=predict`` on a file without labels, for every task (dp has its own tests): a model trained
on ``data=sample`` predicts its dev file with the labels taken out exactly as the training run predicted
the labelled dev file, and writes no gold. One trained run per task is shared by the module's tests."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import compose, encoder_inputs

TRAIN = ["model=tiny", "data=sample", "train.max_steps=4", "train.batch_size=8", "train.learning_rate=1e-3"]
# token tasks train longer: their predictions then hold entities, not only O
TOKEN_TRAIN = ["train.max_steps=40", "train.learning_rate=3e-3"]
NER_SAMPLES = Path(__file__).resolve().parents[1] / "tasks" / "samples" / "ner"
# what each trained run is told: the task, its options, its files (default: the task's samples)
SETUPS = {**{task: [f"task={task}"] for task in ("ynat", "nli", "sts", "re", "text_cls", "korquad", "mrc", "qa")},
          "text_pair": ["task=text_pair"],
          "ner": ["task=ner", *TOKEN_TRAIN], "token_cls": ["task=token_cls", *TOKEN_TRAIN],
          # a tag per character (task.join=""), on KLUE NER's samples read as CoNLL
          "token_cls_chars": ["task=token_cls", "task.join=", "task.comment_prefix='##'", *TOKEN_TRAIN,
                              f"data.train_file={NER_SAMPLES / 'train.tsv'}",
                              f"data.validation_file={NER_SAMPLES / 'dev.tsv'}"]}
LABEL_KEYS = {"label", "gold_label", "label2", "label3", "label4", "label5", "labels", "annotations"}
QA_LABEL_KEYS = {"answers", "plausible_answers", "is_impossible"}


# ---- the dev sample without its labels, one small function per format ----------------------------
def json_list_unlabelled(src: Path, dst: Path) -> None:
    rows = json.loads(src.read_text(encoding="utf-8"))
    dst.write_text(json.dumps([{k: v for k, v in row.items() if k not in LABEL_KEYS} for row in rows],
                              ensure_ascii=False), encoding="utf-8")


def jsonl_unlabelled(src: Path, dst: Path) -> None:
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    dst.write_text("".join(json.dumps({k: v for k, v in row.items() if k not in LABEL_KEYS}, ensure_ascii=False)
                           + "\n" for row in rows), encoding="utf-8")


def tsv_unlabelled(src: Path, dst: Path) -> None:
    rows = list(csv.reader(src.read_text(encoding="utf-8").splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    keep = [i for i, name in enumerate(rows[0]) if name not in LABEL_KEYS]
    dst.write_text("".join("\t".join(row[i] for i in keep) + "\n" for row in rows), encoding="utf-8")


def squad_unlabelled(src: Path, dst: Path) -> None:
    data = json.loads(src.read_text(encoding="utf-8"))
    for article in data["data"]:
        for para in article["paragraphs"]:
            para["qas"] = [{k: v for k, v in qa.items() if k not in QA_LABEL_KEYS} for qa in para["qas"]]
    dst.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def columns_unlabelled(src: Path, dst: Path) -> None:
    """CoNLL / KLUE NER TSV: each unit row keeps its unit only (a space character stays a space);
    comment and blank lines stay, so the line numbers do too."""
    lines = src.read_text(encoding="utf-8").splitlines()
    dst.write_text("".join((line if line.startswith("##") or "\t" not in line else line.split("\t")[0]) + "\n"
                           for line in lines), encoding="utf-8")


def sentences_of(src: Path, join: str) -> list[str]:
    """The sentences of a column file (units joined by ``join``), one per line: plain text."""
    sentences, units = [], []
    for line in src.read_text(encoding="utf-8").splitlines() + [""]:
        if line.startswith("##"):
            continue
        if "\t" in line:
            units.append(line.split("\t")[0])
        elif units:
            sentences.append(join.join(units))
            units = []
    return sentences


UNLABEL = {"ynat": json_list_unlabelled, "nli": json_list_unlabelled, "sts": json_list_unlabelled,
           "re": json_list_unlabelled, "text_cls": tsv_unlabelled, "text_pair": jsonl_unlabelled,
           "korquad": squad_unlabelled, "mrc": squad_unlabelled, "qa": squad_unlabelled,
           "ner": columns_unlabelled, "token_cls": columns_unlabelled, "token_cls_chars": columns_unlabelled}


def dev_file(setup: str) -> Path:
    from tasks.splits import sample_file

    given = [arg.split("=", 1)[1] for arg in SETUPS[setup] if arg.startswith("data.validation_file=")]
    return Path(given[0] if given else sample_file(compose(SETUPS[setup][:1]).task, "validation"))


# ---- one trained run per task -------------------------------------------------------------------
def run(overrides: list[str], run_dir: Path, cache_dir: str) -> dict:
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    return execute(compose(overrides + [f"cache_dir={cache_dir}"]), str(run_dir))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """``trained(setup)``: the run directory of a short training run of ``SETUPS[setup]`` (once)."""
    runs: dict[str, Path] = {}

    def get(setup: str) -> Path:
        if setup not in runs:
            run_dir = tmp_path_factory.mktemp(f"train-{setup}")
            res = run([*TRAIN, *SETUPS[setup]], run_dir, cache_dir)
            assert res["status"] == "ok", res.get("error")
            runs[setup] = run_dir
        return runs[setup]

    return get


def predict(setup: str, checkpoint: Path, predict_file: Path, cache_dir: str) -> list[dict]:
    """The records of ``action=predict`` on ``predict_file``."""
    run_dir = predict_file.parent / f"predict-{predict_file.stem}"
    res = run([*TRAIN, *SETUPS[setup], "action=predict", f"checkpoint={checkpoint}",
               f"data.predict_file={predict_file}"], run_dir, cache_dir)
    assert res["status"] == "ok", res.get("error")
    return records(run_dir)


def without_gold(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("gold")} for r in recs]


def text_and_prediction(recs: list[dict]) -> list[tuple]:
    return [(r["text"], r["prediction"]) for r in recs]


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_predict_on_the_unlabelled_dev_file_repeats_the_training_predictions(setup, trained, tmp_path, cache_dir):
    dev = dev_file(setup)
    unlabelled = tmp_path / dev.name  # the same name: ids made of file name and line match
    UNLABEL[setup](dev, unlabelled)
    got = predict(setup, trained(setup), unlabelled, cache_dir)
    assert not [k for r in got for k in r if k.startswith("gold")], "gold keys from an unlabelled file"
    assert got == without_gold(records(trained(setup)))
    # after 4 steps many tasks predict one label (or null) for every row: what makes the predictions
    # equal is that the model reads the same inputs from both files, token for token
    setting = [*TRAIN, *SETUPS[setup], f"checkpoint={trained(setup)}", f"cache_dir={cache_dir}"]
    assert encoder_inputs([*setting, f"data.predict_file={unlabelled}"], "predict") == \
        encoder_inputs(setting, "validation")


@pytest.mark.parametrize("setup,join", [("ner", ""), ("token_cls", " "), ("token_cls_chars", "")])
def test_token_tasks_predict_plain_text_one_sentence_per_line(setup, join, trained, tmp_path, cache_dir):
    """KLUE NER and token_cls with ``task.join=""``: the characters of each line, spaces included,
    are the units; token_cls over words: its words. Ids are the plain file's own lines."""
    plain = tmp_path / "sentences.txt"
    sentences = sentences_of(dev_file(setup), join)
    plain.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    got = predict(setup, trained(setup), plain, cache_dir)
    assert [r["id"] for r in got] == [f"sentences.txt:{n}" for n in range(1, len(sentences) + 1)]
    assert all(set(r) == {"id", "text", "units", "prediction", "entities"} for r in got)
    assert all(len(r["units"]) == len(r["prediction"]) and join.join(r["units"]) == r["text"] for r in got)
    assert text_and_prediction(got) == text_and_prediction(records(trained(setup)))
    assert any(tag != "O" for r in got for tag in r["prediction"])  # TOKEN_TRAIN: not an all-O agreement


# ---- what "auto" found in training decodes an unlabelled file; malformed files ------------------
def reloaded(task_name: str, trained_task) -> object:
    """A fresh task as action=predict builds it from a checkpoint of ``trained_task``."""
    from kotune.loading.reconcile import task_for_checkpoint
    from tasks import build_task

    meta = {"labels": trained_task.labels,  # what kotune/loading/build.py saves with the model
            "task_options": {k: trained_task.cfg.get(k) for k in trained_task.saved_options}}
    return task_for_checkpoint(build_task(compose([f"task={task_name}"]).task), meta, "ckpt")


def test_unlabelled_token_file_is_written_in_the_training_files_tag_scheme(tmp_path):
    from tasks import build_task

    (tmp_path / "train.conll").write_text("김\tS-PER\n씨\tO\n\n도담\tB-ORG\n대학교\tE-ORG\n", encoding="utf-8")
    (tmp_path / "predict.conll").write_text("도담\n대학교\n김\n", encoding="utf-8")
    task = build_task(compose(["task=token_cls"]).task)
    task.fit_labels(task.read_file(str(tmp_path / "train.conll")))
    predictor = reloaded("token_cls", task)
    examples = predictor.read_file(str(tmp_path / "predict.conll"), labelled=False)
    assert [ex["units"] for ex in examples] == [["도담", "대학교", "김"]] and "tags" not in examples[0]
    assert predictor.prediction_records([["B-ORG", "I-ORG", "B-PER"]], examples) == [
        {"id": "predict.conll:1", "text": "도담 대학교 김", "units": ["도담", "대학교", "김"],
         "prediction": ["B-ORG", "E-ORG", "S-PER"],
         "entities": [{"type": "ORG", "text": "도담 대학교", "start": 0, "end": 6},
                      {"type": "PER", "text": "김", "start": 7, "end": 8}]}]


def test_null_answers_found_in_training_decode_an_unlabelled_file():
    from tasks import build_task
    from tasks.splits import sample_file

    task = build_task(compose(["task=qa"]).task)
    task.fit_labels(task.read_file(sample_file(compose(["task=mrc"]).task, "train")))  # has unanswerable questions
    assert task.allow_null is True
    assert reloaded("qa", task).allow_null is True  # not re-guessed from a file that has no labels


@pytest.mark.parametrize("task,text,where", [
    ("ner", "## s1\t밤\n밤\tB-TI\n시\n", "predict.tsv:3: no tag, but line 2 has one"),
    ("ner", "## s1\t밤\n밤\n시\tO\tX\n", "predict.tsv:3: 3 tab-separated columns"),
    ("token_cls", "김\n씨\tO\n", "predict.tsv:2: a tag, but line 1 has none"),
    ("token_cls", "김 씨가\tB-PER O\n도담 대학교\tB-ORG I-ORG\n김 씨가 왔다\n",
     "predict.tsv:3: no tag, but line 1 has one"),
])
def test_malformed_unlabelled_file_is_one_line_naming_file_and_line(task, text, where, tmp_path):
    from tasks import build_task
    from kotune.core.errors import DataError

    path = tmp_path / "predict.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as err:
        build_task(compose([f"task={task}"]).task).read_file(str(path), labelled=False)
    assert where in str(err.value) and "\n" not in str(err.value)


def test_predict_reads_a_tagged_file_split_by_spaces_as_columns_with_its_tags(tmp_path):
    """A file without tabs whose lines end in a tag is CoNLL (``word tag``), not sentences of two words."""
    from tasks import build_task

    path = tmp_path / "spaced.conll"
    path.write_text("임태호 B-PER\n씨는 O\n\n여수 B-LOC\n", encoding="utf-8")
    examples = build_task(compose(["task=token_cls"]).task).read_file(str(path), labelled=False)
    assert [(ex["units"], ex["tags"]) for ex in examples] == [(["임태호", "씨는"], ["B-PER", "O"]), (["여수"], ["B-LOC"])]
