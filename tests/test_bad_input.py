"""Bad input: one clear line naming the file, the row and what is wrong; never a traceback;
a results.json with status "failed" is still written.

The command line runs in the test's process (``conftest.run_cli_here``: its entry point, stdout,
stderr and exit status), except where the check needs a new process: the hub tests set
HF_HUB_OFFLINE and HF_ENDPOINT, read when huggingface_hub loads, and so run ``python run.py`` end
to end (its one error line, no traceback, exit status and results.json as a user gets them)."""
from __future__ import annotations

import json
import time

import pytest

from conftest import run_cli, run_cli_here, shared_path

NLI_ROW = {"guid": "g0", "premise": "비가 온다.", "hypothesis": "날씨가 맑다.", "gold_label": "contradiction"}


def fail(args: list[str], tmp_path, code: int = 1, env: dict | None = None) -> str:
    """The one error line of a command that fails; with ``env``, a new process that has it."""
    full = args + [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli(full, env=env) if env else run_cli_here(full)
    assert proc.returncode == code, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-1500:]
    if code == 1:
        res = json.loads((tmp_path / "run" / "results.json").read_text())
        assert res["status"] == "failed" and res["error"] in errors[0]
    return errors[0]


@pytest.mark.parametrize("group,value", [("task", "nli2"), ("model", "bert"), ("mode", "freeze")])
def test_unknown_group_choice_lists_the_choices(group, value, tmp_path):
    line = fail([f"{group}={value}"], tmp_path, code=2)
    assert f"unknown {group} '{value}'" in line and "choices:" in line
    assert {"task": "ynat", "model": "tiny", "mode": "frozen"}[group] in line


def test_missing_file(tmp_path):
    line = fail(["model=tiny", f"data.train_file={tmp_path}/nope.json", "data.validation_split=0.2"], tmp_path)
    assert "nope.json: file not found" in line


def test_malformed_json_names_the_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[\n {"premise": "a",\n  "hypothesis": "b" "gold_label": "neutral"}\n]', encoding="utf-8")
    line = fail(["model=tiny", f"data.train_file={bad}", "data.validation_split=0.5"], tmp_path)
    assert f"{bad}:3: malformed JSON" in line


def test_tsv_row_with_wrong_column_count(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("text\tlabel\n좋아요\t긍정\n별로예요\n", encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={bad}", "data.validation_split=0.5"], tmp_path)
    assert f"{bad}:3: 1 columns, the header has 2" in line


def test_unknown_label_name(tmp_path):
    bad = tmp_path / "nli.json"
    rows = [NLI_ROW, dict(NLI_ROW, guid="g1", gold_label="entail")]
    bad.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    line = fail(["model=tiny", f"data.train_file={bad}", "data.validation_split=0.5"], tmp_path)
    assert f"{bad}:row 1: unknown label 'entail'" in line and "entailment" in line


def test_missing_field_and_empty_text(tmp_path):
    bad = tmp_path / "nli.json"
    bad.write_text(json.dumps([NLI_ROW, dict(NLI_ROW, premise="  ")], ensure_ascii=False), encoding="utf-8")
    assert f"{bad}:row 1: empty" in fail(["model=tiny", f"data.train_file={bad}",
                                           "data.validation_split=0.5"], tmp_path)
    bad.write_text(json.dumps([NLI_ROW, {"premise": "a", "gold_label": "neutral"}]), encoding="utf-8")
    assert f"{bad}:row 1: missing field 'hypothesis'" in fail(["model=tiny", f"data.train_file={bad}",
                                                              "data.validation_split=0.5"], tmp_path)


def test_tsv_with_literal_quotes_reads_as_written_and_csv_quoting_names_the_row(tmp_path):
    """A field opening with a quote it never closes: CSV quoting swallows the rest of the file."""
    tsv = tmp_path / "quotes.tsv"
    tsv.write_text('id\ttext\tlabel\n1\t좋아요\t긍정\n2\t"엄마, 저 왔어요. 그가 말했다\t긍정\n3\t별로\t부정\n'
                   '4\t그냥 그래요\t부정\n', encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={tsv}", "data.validation_split=0.5",
                 "data.quoting=csv"], tmp_path)
    assert f"{tsv}:3: 2 columns, the header has 3" in line and "data.quoting=none" in line
    proc = run_cli_here(["task=text_cls", "model=tiny", f"data.train_file={tsv}", "data.validation_split=0.5",
                         "train.max_steps=1", f"hydra.run.dir={tmp_path / 'ok'}"])
    assert proc.returncode == 0, proc.stderr[-1500:]  # auto: a .tsv is read with quoting off
    res = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert res["n_train"] + res["n_eval"] == 4


def test_tsv_row_with_a_tab_too_many_suggests_csv_quoting(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text('text\tlabel\n좋아요\t긍정\n"탭\t들어간 글"\t부정\n', encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={bad}", "data.validation_split=0.5"], tmp_path)
    assert f"{bad}:3: 3 columns, the header has 2" in line and "data.quoting=csv" in line


def test_bad_quoting_value_names_the_option(tmp_path):
    line = fail(["task=text_cls", "model=tiny", "data=sample", "data.quoting=rfc"], tmp_path)
    assert "data.quoting=rfc" in line and "auto, none, csv" in line


@pytest.mark.parametrize("header,option,missing", [
    ("comments\tcontain_gender_bias\tbias", "data.label_column=hate", "hate"),  # the label column
    ("comment\thate", "data.label_column=hate", "comments"),                    # the text column
])
def test_missing_column_names_file_columns_and_option(header, option, missing, tmp_path):
    bad = tmp_path / "hate.tsv"
    rows = "".join("\t".join(["댓글"] + ["none"] * header.count("\t")) + "\n" for _ in range(4))
    bad.write_text(header + "\n" + rows, encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={bad}", "data.validation_split=0.5",
                 "data.text_column=comments", option], tmp_path)
    columns = header.replace("\t", ", ")
    which = "label" if missing == "hate" else "text"
    assert line == f"error: {bad}: has no column '{missing}' (columns: {columns}; set data.{which}_column=)"


def test_missing_column_of_a_klue_task_names_the_same_data_option(tmp_path):
    bad = tmp_path / "nli.json"
    bad.write_text(json.dumps([{k: v for k, v in NLI_ROW.items() if k != "gold_label"}] * 2, ensure_ascii=False),
                   encoding="utf-8")
    line = fail(["model=tiny", f"data.train_file={bad}", "data.validation_split=0.5"], tmp_path)
    assert f"{bad}: has no column 'gold_label' (columns: guid, premise, hypothesis; set data.label_column=)" \
        in line


def test_a_column_setting_the_task_does_not_read_is_one_line(tmp_path):
    line = fail(["task=ner", "model=tiny", "data=sample", "data.label_column=tag"], tmp_path)
    assert line == "error: data.label_column=tag: task ner has no label column (its file format fixes its fields)"


@pytest.mark.parametrize("task,body,line_no", [
    ("ner", "## s1\t<서울:LC>\n서\tB-LC\n울\n", 3),           # KLUE NER: a CHAR-only line
    ("ner", "## s1\t<서울:LC> 가\n서\tB-LC\n울\tI-LC\n \n가\tO\n", 4),  # a space whose tag is missing
    ("token_cls", "EU\tB-ORG\nrejects\nit\tO\n", 2),          # CoNLL: a word without its tag
    ("token_cls", "EU B-ORG\nrejects\t\n", 2),                  # an empty tag column
])
def test_tagging_line_without_a_tag(task, body, line_no, tmp_path):
    bad = tmp_path / "tags.tsv"
    bad.write_text(body, encoding="utf-8")
    line = fail([f"task={task}", "model=tiny", f"data.train_file={bad}", f"data.validation_file={bad}"], tmp_path)
    assert line.startswith(f"error: {bad}:{line_no}: no tag")


def test_validation_label_unseen_in_training(tmp_path):
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n좋아요,긍정\n별로,부정\n", encoding="utf-8")
    dev.write_text("text,label\n그냥 그래요,중립\n", encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={train}", f"data.validation_file={dev}"],
                tmp_path)
    assert "unknown label '중립'" in line and "긍정" in line
    assert line.startswith(f"error: {dev}:") and "sha256" not in line  # the path, not the split's source dict


def test_hub_model_offline_fails_fast_and_says_what_to_do(tmp_path):
    started = time.time()
    line = fail(["model=klue", "data=sample", "train.max_steps=1"], tmp_path,
                env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "https://huggingface.co"})
    assert time.time() - started < 30
    assert "klue/bert-base" in line and "unreachable" in line and "model.name_or_path" in line


def test_hub_dataset_offline_points_at_local_files(tmp_path):
    line = fail(["task=ynat", "model=tiny"], tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert "klue/klue" in line and "data.train_file" in line


def test_lowercasing_a_cased_korean_vocab_warns(tmp_path):
    vocab = shared_path("vocab/kcbert-base")
    proc = run_cli_here(["model=kcbert", "model.init=random", f"model.name_or_path={vocab}",
                         "model.config_overrides.num_hidden_layers=1", "model.tokenizer_kwargs.do_lower_case=true",
                         "data=sample", "train.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "[UNK]" in proc.stdout and "do_lower_case=false" in proc.stdout


def test_text_cls_without_files_says_which_option(tmp_path):
    line = fail(["task=text_cls", "model=tiny"], tmp_path)
    assert "data.train_file" in line


def answered_before_torch(args: list[str], said: str, tmp_path) -> None:
    """The command fails saying ``said`` with neither torch nor transformers' Trainer imported: a
    mistake answered in about a second, not after the ~10 s of importing them (an import at a
    module's top brings those seconds back: this sees it)."""
    import subprocess
    import sys

    from conftest import ROOT

    argv = ["run.py", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('loaded:', sorted({'torch', 'transformers.trainer'} & set(sys.modules))))\n"
            f"sys.argv = {argv!r}\n"
            "runpy.run_path('run.py', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "loaded: []", proc.stdout[-2000:]


def test_a_data_mistake_is_answered_before_torch_and_the_trainer_load(tmp_path):
    answered_before_torch(["task=text_cls", "model=tiny", f"data.train_file={tmp_path / 'nope.json'}"],
                          "nope.json: file not found", tmp_path)


def test_a_missing_checkpoint_or_predict_file_is_answered_before_torch_loads(tmp_path, cache_dir):
    answered_before_torch(["action=predict", f"checkpoint={tmp_path / 'nope'}", f"data.predict_file={tmp_path}/x.csv"],
                          f"checkpoint={tmp_path / 'nope'}: no saved model there", tmp_path)
    trained = run_cli_here(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1", "save_predictions=false",
                            f"cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'train'}"])
    assert trained.returncode == 0, trained.stderr[-2000:]
    for action, key in (("predict", "predict_file"), ("eval", "validation_file")):
        answered_before_torch([f"action={action}", f"checkpoint={tmp_path / 'train'}",
                               f"data.{key}={tmp_path / 'nope.csv'}"], "nope.csv: file not found", tmp_path)


@pytest.mark.parametrize("override,line", [
    ("train.max_steps=abc", "train.max_steps=abc: a number expected (default -1)"),
    ("train.learning_rate=fast", "train.learning_rate=fast: a number expected"),
    ("train.select_best=yes", "train.select_best=yes: true or false expected (default false)"),
])
def test_a_value_of_the_wrong_type_is_one_line_before_any_data_is_read(override, line, tmp_path):
    # the data file does not exist: the type is answered first, as no file is read before it
    said = fail(["task=text_cls", "model=tiny", f"data.train_file={tmp_path / 'nope.csv'}",
                 "data.validation_split=0.2", override], tmp_path, code=2)
    assert said.startswith(f"error: {line}")


def test_values_of_the_right_type_pass_the_check():
    from kotune.cli.overrides import bad_override

    assert bad_override(["train.epochs=1.5", "train.learning_rate=1e-3", "train.seed=null", "train.max_steps=10",
                         "train.select_best=true", "train.max_length=${train.batch_size}"]) is None
