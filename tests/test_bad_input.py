"""Bad input: one clear line naming the file, the row and what is wrong; never a traceback;
a results.json with status "failed" is still written."""
from __future__ import annotations

import json
import time

import pytest

from conftest import run_cli, shared_path

NLI_ROW = {"guid": "g0", "premise": "비가 온다.", "hypothesis": "날씨가 맑다.", "gold_label": "contradiction"}


def fail(args: list[str], tmp_path, code: int = 1, **kw) -> str:
    proc = run_cli(args + [f"hydra.run.dir={tmp_path / 'run'}"], **kw)
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
    bad.write_text(json.dumps([{"premise": "a", "gold_label": "neutral"}]), encoding="utf-8")
    assert "missing field 'hypothesis'" in fail(["model=tiny", f"data.train_file={bad}",
                                                 "data.validation_split=0.5"], tmp_path)


def test_validation_label_unseen_in_training(tmp_path):
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n좋아요,긍정\n별로,부정\n", encoding="utf-8")
    dev.write_text("text,label\n그냥 그래요,중립\n", encoding="utf-8")
    line = fail(["task=text_cls", "model=tiny", f"data.train_file={train}", f"data.validation_file={dev}"],
                tmp_path)
    assert "unknown label '중립'" in line and "긍정" in line


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
    proc = run_cli(["model=kcbert", "model.init=random", f"model.name_or_path={vocab}",
                    "model.config_overrides.num_hidden_layers=1", "model.tokenizer_kwargs.do_lower_case=true",
                    "data=sample", "train.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "[UNK]" in proc.stdout and "do_lower_case=false" in proc.stdout


def test_text_cls_without_files_says_which_option(tmp_path):
    line = fail(["task=text_cls", "model=tiny"], tmp_path)
    assert "data.train_file" in line
