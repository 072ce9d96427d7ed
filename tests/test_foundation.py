"""The foundation: config composition, tiny end-to-end runs, reload, and the results contract."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, compose, run_cli, shared_path
from kotune.core.errors import DataError

TASKS = sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml"))
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
MODES = sorted(p.stem for p in (ROOT / "conf" / "mode").glob("*.yaml"))
RESULT_KEYS = {"task", "model", "mode", "action", "seed", "status", "metrics", "n_train", "n_eval",
               "trainable_params", "total_params", "train_samples_per_second",
               "eval_samples_per_second", "runtime_s", "config", "versions", "data", "main_metric"}
SAMPLE_TASKS = {"ynat": {"accuracy", "macro_f1"}, "nli": {"accuracy", "macro_f1"}, "sts": {"pearson", "f1"}}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_model_mode_composes(task):
    from tasks import build_task

    for model in MODELS:
        for mode in MODES:
            cfg = compose([f"task={task}", f"model={model}", f"mode={mode}"])
            assert (cfg.task.name, cfg.model.name, cfg.mode.name) == (task, model, mode)
            from omegaconf import OmegaConf

            OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    built = build_task(compose([f"task={task}"]).task)
    assert built.main_metric


def test_korean_presets_keep_case():
    assert {"klue", "klue-roberta", "kcbert", "koelectra", "kr-electra"} <= set(MODELS)
    for model in set(MODELS) - {"tiny"}:  # tiny trains its own cased tokenizer
        cfg = compose([f"model={model}"])
        assert cfg.model.tokenizer_kwargs.do_lower_case is False, model


def test_kr_electra_preset_builds_offline_from_a_bare_vocabulary(tmp_path):
    """model=kr-electra model.init=random on a vocab.txt alone: an ELECTRA encoder (the preset names
    its architecture) and a tokenizer that keeps Hangul syllables whole."""
    from heads.model.encoder import load_encoder, load_tokenizer

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                   "한국", "##어", "문장", "."]) + "\n", encoding="utf-8")
    cfg = compose(["model=kr-electra", "model.init=random", f"model.name_or_path={tmp_path}",
                   "model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
                   "model.config_overrides.embedding_size=32", "model.config_overrides.num_attention_heads=2",
                   "model.config_overrides.intermediate_size=64"])
    tokenizer = load_tokenizer(cfg.model)
    assert tokenizer.tokenize("한국어 문장.") == ["한국", "##어", "문장", "."]
    encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=0)
    assert encoder.config.model_type == "electra" and encoder.config.vocab_size == 9


@pytest.mark.parametrize("task", sorted(SAMPLE_TASKS))
def test_tiny_end_to_end_on_samples(task, run_job, tmp_path):
    res = run_job([f"task={task}", "model=tiny", "data=sample", "train.max_steps=6", "train.batch_size=8"])
    assert res["status"] == "ok", res.get("error")
    assert RESULT_KEYS <= res.keys()
    assert set(res["metrics"]) == SAMPLE_TASKS[task]
    assert res["main_score"] == res["metrics"][res["main_metric"]]
    import hashlib

    from tasks import build_task
    from tasks.splits import sample_file

    task_cfg = compose([f"task={task}"]).task
    for split, key in (("train", "n_train"), ("validation", "n_eval")):
        path = Path(sample_file(task_cfg, split))
        assert res["data"][split]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert res[key] == len(build_task(task_cfg).read_file(str(path)))  # every sample row, none dropped
    preds = [json.loads(line) for line in (tmp_path / "job" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == res["n_eval"] and {"id", "prediction", "gold"} <= preds[0].keys()
    saved = json.loads((tmp_path / "job" / "model" / "kotune.json").read_text())
    if task != "sts":
        assert saved["meta"]["labels"] == list(compose([f"task={task}"]).task.labels)


def test_eval_reloads_a_saved_run_and_reproduces_its_metrics(run_job, tmp_path):
    trained = run_job(["task=nli", "model=tiny", "data=sample", "train.max_steps=8"], "train")
    again = run_job(["task=nli", "model=tiny", "data=sample", "action=eval",
                     f"checkpoint={tmp_path / 'train'}"], "eval")
    assert again["status"] == "ok", again.get("error")
    assert again["metrics"] == pytest.approx(trained["metrics"])
    assert again["trainable_params"] == trained["trainable_params"]


def test_predict_writes_predictions_in_input_order(run_job, tmp_path):
    run_job(["task=ynat", "model=tiny", "data=sample", "train.max_steps=4"], "train")
    rows = [{"guid": f"p{i}", "title": t} for i, t in enumerate(
        ["삼성전자, 차세대 반도체 공장 착공", "프로야구 개막전 매진", "정부, 내년 예산안 발표"])]
    path = tmp_path / "predict.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    res = run_job(["task=ynat", "model=tiny", "action=predict", f"checkpoint={tmp_path / 'train'}",
                   f"data.predict_file={path}"], "predict")
    assert res["status"] == "ok", res.get("error")
    preds = [json.loads(x) for x in (tmp_path / "predict" / "predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in preds] == ["p0", "p1", "p2"]
    labels = set(compose(["task=ynat"]).task.labels)
    assert all(p["prediction"] in labels for p in preds)


def test_frozen_mode_trains_only_the_head(run_job):
    res = run_job(["task=nli", "model=tiny", "mode=frozen", "data=sample", "train.max_steps=3"])
    assert res["status"] == "ok", res.get("error")
    assert res["trainable_params"] == res["head_params"] < res["total_params"]


def test_cli_contract_on_klue_nli_dev(tmp_path, cache_dir):
    """The command other tools rely on (issue 2's contract), run as a user would."""
    data = shared_path("data/klue/klue-nli-v1.1_dev.json")
    out = tmp_path / "OUT"
    proc = run_cli(["task=nli", "model=tiny", f"data.train_file={data}", "data.validation_split=0.2",
                    "train.max_steps=40", f"hydra.run.dir={out}", f"cache_dir={cache_dir}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "ok" and res["n_train"] == 2400 and res["n_eval"] == 600
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 600  # the accuracy is the written predictions'
    assert res["metrics"]["accuracy"] == pytest.approx(100 * sum(p["prediction"] == p["gold"] for p in preds) / 600)
    # the summary marks the main metric, with its value
    assert re.search(rf"accuracy \*\s+{res['metrics']['accuracy']:.2f}\n", proc.stdout), proc.stdout[-800:]


@pytest.mark.slow
def test_sts_on_klue_dev(run_job):
    data = shared_path("data/klue/klue-sts-v1.1_dev.json")
    res = run_job(["task=sts", "model=tiny", f"data.train_file={data}", "data.validation_split=0.2",
                   "train.max_steps=30"])
    assert res["status"] == "ok", res.get("error")
    assert res["n_eval"] == round(519 * 0.2)
    import statistics

    preds = [json.loads(line) for line in (Path(res["run_dir"]) / "predictions.jsonl").read_text().splitlines()]
    pearson = 100 * statistics.correlation([p["prediction"] for p in preds], [p["gold"] for p in preds])
    assert res["metrics"]["pearson"] == pytest.approx(pearson, abs=1e-6)  # the written predictions' Pearson r


def test_real_vocab_random_encoder_and_position_limit(run_job):
    """kcbert's real vocabulary, a 2-layer random encoder, max_length clamped to its 300 positions."""
    vocab = shared_path("vocab/kcbert-base")
    res = run_job(["task=nli", "model=kcbert", "model.init=random", f"model.name_or_path={vocab}",
                   "model.config_overrides.num_hidden_layers=2", "model.config_overrides.hidden_size=64",
                   "model.config_overrides.num_attention_heads=2", "model.config_overrides.intermediate_size=128",
                   "data=sample", "train.max_steps=2", "train.max_length=512"])
    assert res["status"] == "ok", res.get("error")
    assert res["max_length"] == 300


def test_hub_rows_are_mapped_by_label_name_not_position():
    """Hub rows carry class ids in the hub's order; kotune keeps names, whatever the order."""
    import datasets

    from tasks import build_task

    hub_names = ["entailment", "neutral", "contradiction"]
    rows = datasets.Dataset.from_dict(
        {"guid": ["a", "b"], "premise": ["비가 온다.", "해가 떴다."], "hypothesis": ["젖었다.", "밤이다."],
         "label": [0, 2]},
        features=datasets.Features({"guid": datasets.Value("string"), "premise": datasets.Value("string"),
                                    "hypothesis": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=hub_names)}))
    cfg = compose(["task=nli"]).task
    from omegaconf import OmegaConf

    reordered = OmegaConf.merge(cfg, {"labels": ["entailment", "contradiction", "neutral"]})  # KLUE-baseline's
    for task_cfg in (cfg, reordered):
        examples = build_task(task_cfg).read_hub(rows, "klue/klue/nli:validation")
        assert [(e["id"], e["label"]) for e in examples] == [("a", "entailment"), ("b", "contradiction")]


def test_holdout_is_seeded_and_disjoint():
    from omegaconf import OmegaConf

    from tasks import build_task
    from tasks.splits import load_splits, sample_file

    task = build_task(compose(["task=nli"]).task)
    data = OmegaConf.create({"train_file": sample_file(task.cfg, "train"), "validation_split": 0.25})
    a = load_splits(task, data, ("train", "validation"), seed=1)
    b = load_splits(task, data, ("train", "validation"), seed=1)
    c = load_splits(task, data, ("train", "validation"), seed=2)
    ids = lambda s: [e["id"] for e in s.examples]  # noqa: E731
    assert ids(a["validation"]) == ids(b["validation"]) != ids(c["validation"])
    assert not set(ids(a["train"])) & set(ids(a["validation"]))
    assert len(a["train"].examples) + len(a["validation"].examples) == len(task.read_file(data.train_file))


@pytest.mark.parametrize("task,extra", [
    ("text_cls", []),
    ("text_pair", []),
    ("text_cls", ["data.text_column=text", "data.label_column=label"]),  # the one column knob, as named
])
def test_custom_file_tasks_on_samples(task, extra, run_job):
    res = run_job([f"task={task}", "model=tiny", "data=sample", "train.max_steps=4", *extra])
    assert res["status"] == "ok", res.get("error")
    labels = res["config"]["task"]["labels"]
    assert labels is None  # learned from the training file, then saved with the model
    saved = json.loads((Path(res["run_dir"]) / "model" / "kotune.json").read_text())
    from tasks import build_task
    from tasks.splits import sample_file

    cfg = compose([f"task={task}", "data=sample", *extra])
    built = build_task(cfg.task)
    built.use_columns(cfg.data)
    in_file = {ex["label"] for ex in built.read_file(sample_file(cfg.task, "train"))}
    assert saved["meta"]["labels"] == sorted(in_file) and len(in_file) >= 2  # the training file's, sorted


def test_token_type_ids_only_for_models_that_use_them():
    from transformers import BertConfig, ElectraConfig, RobertaConfig

    from heads.model.encoder import position_limit, train_wordpiece, uses_token_type_ids
    from tasks import build_task
    from tasks.base import EncodeSettings

    assert uses_token_type_ids(BertConfig()) and uses_token_type_ids(ElectraConfig())
    assert not uses_token_type_ids(RobertaConfig(type_vocab_size=1))
    assert position_limit(RobertaConfig(max_position_embeddings=514)) == 512
    task = build_task(compose(["task=nli"]).task)
    ex = [{"id": "a", "text": "비가 온다.", "text_pair": "우산을 썼다.", "label": "neutral"}]
    tok = train_wordpiece([ex[0]["text"], ex[0]["text_pair"]], 100, None)
    with_types = task.encode(ex, tok, EncodeSettings(max_length=16, token_type_ids=True))
    without = task.encode(ex, tok, EncodeSettings(max_length=16, token_type_ids=False))
    assert "token_type_ids" in with_types.column_names and "token_type_ids" not in without.column_names
    assert with_types[0]["token_type_ids"][-1] == 1 and with_types[0]["labels"] == 1


def test_tiny_tokenizer_gets_the_same_ids_in_every_process():
    """The WordPiece trainer numbers "##" pieces in hash-map order (a new order per process), and breaks
    ties between merges by those numbers: the same text got another vocabulary, hence another model,
    in each fresh run of the same command (huggingface/tokenizers#1794; on the NLI sample's text it
    differed in every one of four processes)."""
    import subprocess
    import sys

    script = ("import json; from heads.model.encoder import train_wordpiece; "
              "rows = json.load(open('tasks/samples/nli/train.json', encoding='utf-8')); "
              "texts = [r[k] for r in rows for k in ('premise', 'hypothesis')]; "
              "print(json.dumps(train_wordpiece(texts, 2000, None).get_vocab(), sort_keys=True))")
    vocabs = {subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout for _ in range(3)}
    assert len(vocabs) == 1
    vocab = json.loads(vocabs.pop())
    assert [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])][:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ---- reading CSV/TSV as written (data.quoting) -----------------------------------------------------
def test_tsv_quotes_are_text_csv_quotes_are_rfc4180(tmp_path):
    from tasks.io import read_records

    tsv = tmp_path / "a.tsv"
    tsv.write_text('text\tlabel\n그리고 그가 말했다, "엄마, 저 왔어요."\t긍정\n"따옴표로 시작\t부정\n', encoding="utf-8")
    rows = [r["text"] for _, r in read_records(str(tsv))]
    assert rows == ['그리고 그가 말했다, "엄마, 저 왔어요."', '"따옴표로 시작']
    csv_file = tmp_path / "a.csv"
    csv_file.write_text('text,label\n"좋아요, ""정말""",긍정\n', encoding="utf-8")
    assert read_records(str(csv_file))[0][1] == {"text": '좋아요, "정말"', "label": "긍정"}
    with pytest.raises(DataError, match=r"a\.csv:2: 3 columns, the header has 2 .*data\.quoting=csv"):
        read_records(str(csv_file), quoting="none")
    with pytest.raises(DataError, match=r"a\.tsv:3: 1 columns, the header has 2 .*data\.quoting=none"):
        read_records(str(tsv), quoting="csv")  # the unclosed quote swallows the tab and the line end


def test_hate_speech_tsv_reads_every_row(capsys):
    """The shared hate-speech TSV (literal quotes in comments) reads fully with data.quoting=auto."""
    from tasks.io import read_records

    for name in ("train", "dev"):
        path = shared_path(f"data/hate-speech/{name}.tsv")
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        rows = read_records(str(path))
        assert len(rows) == lines - 1  # wc -l minus the header
        assert all(len(r) == 4 for _, r in rows)
    assert "look CSV-quoted" in capsys.readouterr().out  # 10 + 2 rows written CSV-style: said, kept literal


def test_predict_file_needs_no_label_column_but_training_files_do(tmp_path):
    from omegaconf import OmegaConf

    from tasks import build_task
    from tasks.splits import load_splits

    texts = tmp_path / "texts.tsv"
    texts.write_text("text\n좋아요\n별로\n", encoding="utf-8")
    task = build_task(compose(["task=text_cls"]).task)
    data = OmegaConf.create({"predict_file": str(texts), "train_file": str(texts), "validation_split": 0.5})
    assert [e["text"] for e in load_splits(task, data, ("predict",), seed=1)["predict"].examples] == ["좋아요", "별로"]
    with pytest.raises(DataError, match=r"texts\.tsv: has no column 'label' \(columns: text; set data\.label_column=\)"):
        load_splits(task, data, ("train", "validation"), seed=1)


def test_split_names_its_file_or_hub_split_not_its_source_dict():
    from tasks.splits import Split

    assert Split([], {"file": "/d/train.tsv", "sha256": "ab"}).where == "/d/train.tsv"
    assert Split([], {"hub": "klue/klue", "name": "nli", "split": "validation", "revision": None}).where == \
        "klue/klue/nli:validation"


def test_holdout_keeps_an_nli_premise_on_one_side(tmp_path):
    """KLUE NLI has three hypotheses per premise, one per label: split by premise, not by row."""
    from omegaconf import OmegaConf

    from tasks import build_task
    from tasks.splits import load_splits

    rows = [{"guid": f"p{p}-{label}", "premise": f"전제 {p}", "hypothesis": f"가설 {p} {label}", "gold_label": label}
            for p in range(40) for label in ("entailment", "neutral", "contradiction")]
    path = tmp_path / "nli.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    task = build_task(compose(["task=nli"]).task)
    for seed in (1, 2, 3):
        split = load_splits(task, OmegaConf.create({"train_file": str(path), "validation_split": 0.2}),
                            ("train", "validation"), seed=seed)
        premises = {s: {ex["text"] for ex in split[s].examples} for s in ("train", "validation")}
        assert not premises["train"] & premises["validation"]
        assert len(split["validation"].examples) == 24 and len(split["train"].examples) == 96
