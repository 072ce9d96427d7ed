"""action=export: a standard transformers directory for the head's native class. On shared data its
logits equal the kotune model's (1e-5) and ``transformers.pipeline`` — run in a process that never
imports kotune — gives kotune's predictions; heads with no native equivalent are refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, compose, shared_path

SMALL = ["model.init=random", "model.config_overrides.num_hidden_layers=2", "model.config_overrides.hidden_size=64",
         "model.config_overrides.num_attention_heads=2", "model.config_overrides.intermediate_size=128"]
# barely trained: the head stays near its random init, so its predictions spread over the labels
# and agreement is not the trivial all-"O" / all-majority kind
TRAIN = ["train.max_steps=2", "train.learning_rate=1e-5", "train.batch_size=16", "train.warmup_ratio=0"]


def kcbert() -> list[str]:
    return ["model=kcbert", f"model.name_or_path={shared_path('vocab/kcbert-base')}", *SMALL]


def koelectra() -> list[str]:
    return ["model=koelectra", f"model.name_or_path={shared_path('vocab/koelectra')}", "model.architecture=electra",
            "model.config_overrides.embedding_size=32", *SMALL]


def in_fresh_python(code: str, cwd, inputs) -> dict:
    """Run ``code`` in a fresh process outside the checkout, then check it never imported kotune;
    ``code`` reads ``inputs`` and prints one JSON line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    (cwd / "inputs.json").write_text(json.dumps(inputs, ensure_ascii=False), encoding="utf-8")
    code = "import json\ninputs = json.load(open('inputs.json', encoding='utf-8'))\n" + code
    check = "\nassert not {'tasks', 'heads', 'run'} & set(sys.modules), 'kotune was imported'\n"
    proc = subprocess.run([sys.executable, "-c", "import sys\n" + code + check],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kotune_and_native_logits(model_dir: str, export_dir: str, texts, pairs=None):
    """Both models on the same encoded batch: kotune's tokenizer and the exported one agree first."""
    from transformers import AutoModel, AutoTokenizer

    from kotune.export.native import native_class
    from heads.model.kotune_model import KotuneModel

    ours = KotuneModel.load(model_dir).eval()
    native = native_class(ours).from_pretrained(export_dir).eval()
    tok_ours, tok_native = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(export_dir)
    args = (texts, pairs) if pairs is not None else (texts,)
    enc = tok_ours(*args, truncation=True, max_length=ours.meta["max_length"], padding=True, return_tensors="pt")
    enc_native = tok_native(*args, truncation=True, padding=True, return_tensors="pt")
    assert all(torch.equal(enc[k], enc_native[k]) for k in enc_native)
    if not ours.meta["token_type_ids"]:
        enc.pop("token_type_ids", None)
    with torch.no_grad():
        return ours(**enc)["logits"], native(**enc_native), enc["attention_mask"].bool()


def adapter_moved_the_encoder(model_dir: str, export_dir: str) -> float:
    """mode=lora: how far the exported (merged) query weights are from the base encoder's."""
    from transformers import AutoModel

    from heads.model.lora import rebuild_base

    with open(os.path.join(model_dir, "kotune.json"), encoding="utf-8") as f:
        record = json.load(f)["lora"]["base"]
    base = rebuild_base(record, model_dir).encoder.layer[0].attention.self.query.weight
    merged = AutoModel.from_pretrained(export_dir).encoder.layer[0].attention.self.query.weight
    return float((merged - base).abs().max())


# mode=lora: a rate at which two steps move the adapter (it starts at zero) well past the merge tolerance
MODE_TRAIN = {"finetune": [], "lora": ["mode=lora", "train.learning_rate=2e-3"]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODE_TRAIN))
def test_sequence_export_equals_kotune_and_serves_the_pipeline(mode, run_job, tmp_path):
    data = shared_path("data/hate-speech")
    common = ["task=text_cls", *kcbert(), "data=sample", "data.text_column=comments", "data.label_column=hate"]
    res = run_job([*common, f"data.train_file={data / 'train.tsv'}", f"data.validation_file={data / 'dev.tsv'}",
                   "data.max_train_samples=100", *TRAIN, *MODE_TRAIN[mode], "save_predictions=false"], "train")
    assert res["status"] == "ok", res.get("error")
    pred = run_job([*common, "action=predict", f"checkpoint={tmp_path / 'train'}",
                    f"data.predict_file={data / 'dev.tsv'}"], "predict")
    assert pred["status"] == "ok", pred.get("error")
    out = run_job([*common, "action=export", f"checkpoint={tmp_path / 'train'}", f"export.dir={tmp_path / 'hf'}"],
                  "export")
    assert out["status"] == "ok", out.get("error")
    assert out["native_class"] == "BertForSequenceClassification" and out["pipeline"] == "text-classification"
    assert out["lora_merged"] == (mode == "lora")
    if mode == "lora":
        # the adapter is in the export: its weights moved 10× the merge's tolerance (1e-4) or more
        assert adapter_moved_the_encoder(str(tmp_path / "train" / "model"), str(tmp_path / "hf")) > 1e-3
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {"0": "hate", "1": "none", "2": "offensive"}
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"] is False

    records = [json.loads(line) for line in (tmp_path / "predict" / "predictions.jsonl").read_text().splitlines()]
    import csv

    with open(data / "dev.tsv", encoding="utf-8") as f:
        texts = [row["comments"] for row in csv.DictReader(f, delimiter="\t")]
    assert len(texts) == len(records) == 471
    ours, theirs, _ = kotune_and_native_logits(str(tmp_path / "train" / "model"), str(tmp_path / "hf"), texts)
    assert torch.allclose(ours, theirs.logits, atol=1e-5)

    served = in_fresh_python(
        "import json, transformers\n"
        "texts = inputs\n"
        f"pipe = transformers.pipeline('text-classification', model={str(tmp_path / 'hf')!r}, device='cpu')\n"
        "out = pipe(texts, truncation=True, batch_size=32, top_k=None)\n"
        "print(json.dumps([{o['label']: o['score'] for o in scores} for scores in out]))", tmp_path, texts)
    # every label's probability, not only the (here mostly majority-class) top label
    names = ["hate", "none", "offensive"]
    probabilities = torch.tensor([[s[n] for n in names] for s in served], dtype=torch.float64)
    assert torch.allclose(probabilities, ours.double().softmax(-1), atol=1e-5)
    assert [names[i] for i in probabilities.argmax(-1)] == [r["prediction"] for r in records]


@pytest.mark.slow
def test_token_export_equals_kotune_and_serves_the_pipeline(run_job, tmp_path):
    """ELECTRA on KLUE NER (subword decoding): each pipeline token's label is kotune's tag at the
    token's first character."""
    data = shared_path("data/klue/klue-ner-v1.1_dev.tsv")
    res = run_job(["task=ner", *koelectra(), "data=sample", f"data.train_file={data}", f"data.validation_file={data}",
                   "data.max_train_samples=200", "data.max_eval_samples=150", *TRAIN], "train")
    assert res["status"] == "ok", res.get("error")
    out = run_job(["task=ner", *koelectra(), "action=export", f"checkpoint={tmp_path / 'train'}",
                   f"export.dir={tmp_path / 'hf'}"], "export")
    assert out["status"] == "ok", out.get("error")
    assert out["native_class"] == "ElectraForTokenClassification"
    records = [json.loads(line) for line in (tmp_path / "train" / "predictions.jsonl").read_text().splitlines()]
    texts = [r["text"] for r in records]
    ours, theirs, real = kotune_and_native_logits(str(tmp_path / "train" / "model"), str(tmp_path / "hf"), texts[:32])
    assert torch.allclose(ours[real], theirs.logits[real], atol=1e-5)

    served = in_fresh_python(
        "import json, transformers\n"
        "texts = inputs\n"
        f"pipe = transformers.pipeline('token-classification', model={str(tmp_path / 'hf')!r}, device='cpu',"
        " aggregation_strategy='none', ignore_labels=[])\n"
        "print(json.dumps([[(t['start'], t['entity']) for t in tokens] for tokens in pipe(texts)]))", tmp_path, texts)
    compared = []
    for record, tokens in zip(records, served):
        for start, label in tokens:
            assert record["prediction"][start] == label, (record["id"], start, label)
            compared.append(label)
    assert len(compared) > 200 and len(set(compared)) >= 2  # not a trivial all-O agreement


def QA_DATA(data) -> list[str]:  # noqa: N802 - a constant that needs the path
    return ["data=sample", f"data.train_file={data}", f"data.validation_file={data}", "data.max_train_samples=100",
            "data.max_eval_samples=200"]


@pytest.mark.slow
def test_span_export_equals_kotune_and_serves_the_pipeline(run_job, tmp_path):
    """BERT on KorQuAD: the standard AutoModelForQuestionAnswering recipe answers as kotune does,
    on the questions whose context fits one window (the windowing of long contexts is kotune's)."""
    data = shared_path("data/korquad/KorQuAD_v1.0_dev.json")
    res = run_job(["task=korquad", *kcbert(), "data=sample", *QA_DATA(data), *TRAIN], "train")
    assert res["status"] == "ok", res.get("error")
    out = run_job(["task=korquad", *kcbert(), "action=export", f"checkpoint={tmp_path / 'train'}",
                   f"export.dir={tmp_path / 'hf'}"], "export")
    assert out["status"] == "ok", out.get("error")
    assert out["native_class"] == "BertForQuestionAnswering" and out["pipeline"] is None
    answers = json.loads((tmp_path / "train" / "predictions.json").read_text())

    from tasks import build_task
    from tasks.splits import load_splits

    cfg = compose(["task=korquad", *QA_DATA(data)])
    examples = load_splits(build_task(cfg.task), cfg.data, ("train", "validation"), 42)["validation"].examples
    assert {ex["id"] for ex in examples} == set(answers)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    single = [ex for ex in examples if len(tokenizer(ex["question"], ex["context"])["input_ids"]) <= 300]
    assert len(single) >= 40
    questions = [ex["question"] for ex in single]
    ours, theirs, real = kotune_and_native_logits(str(tmp_path / "train" / "model"), str(tmp_path / "hf"),
                                                  questions[:16], [ex["context"] for ex in single[:16]])
    for mine, hf in zip(ours, (theirs.start_logits, theirs.end_logits)):
        assert torch.allclose(mine[real], hf[real], atol=1e-5)

    # transformers 5 removed the question-answering pipeline: the standard recipe is
    # AutoModelForQuestionAnswering + the n-best span search of HF's run_qa example (20 starts ×
    # 20 ends inside the context, end ≥ start, at most 30 tokens)
    served = in_fresh_python(
        "import torch, transformers\n"
        f"d = {str(tmp_path / 'hf')!r}\n"
        "tok = transformers.AutoTokenizer.from_pretrained(d)\n"
        "model = transformers.AutoModelForQuestionAnswering.from_pretrained(d).eval()\n"
        "answers = []\n"
        "for q in inputs:\n"
        "    enc = tok(q['question'], q['context'], truncation='only_second', return_offsets_mapping=True,"
        " return_tensors='pt')\n"
        "    offsets = enc.pop('offset_mapping')[0].tolist()\n"
        "    context = [i for i, sid in enumerate(enc.sequence_ids(0)) if sid == 1]\n"
        "    with torch.no_grad():\n"
        "        out = model(**enc)\n"
        "    s, e = out.start_logits[0].double(), out.end_logits[0].double()\n"
        "    starts = sorted(context, key=lambda i: -s[i])[:20]\n"
        "    ends = sorted(context, key=lambda i: -e[i])[:20]\n"
        "    a, b = max(((a, b) for a in starts for b in ends if a <= b < a + 30), key=lambda ab: s[ab[0]] + e[ab[1]])\n"
        "    answers.append(q['context'][offsets[a][0]:offsets[b][1]])\n"
        "print(json.dumps(answers, ensure_ascii=False))", tmp_path,
        [{"question": ex["question"], "context": ex["context"]} for ex in single])
    assert served == [answers[ex["id"]] for ex in single]
    assert len(set(served)) > len(served) // 2


def test_pair_export_of_the_tiny_model_serves_pairs_as_kotune_predicts_them(run_job, tmp_path):
    """The tiny tokenizer names token_type_ids among its inputs: without them pipeline() gave every
    pair segment 0 while kotune trained with 1 for the second text (2 of 21 NLI sample labels agreed)."""
    common = ["task=nli", "model=tiny", "data=sample"]
    assert run_job([*common, "train.max_steps=30", "train.learning_rate=3e-3"], "train")["status"] == "ok"
    dev = ROOT / "tasks" / "samples" / "nli" / "dev.json"
    assert run_job([*common, "action=predict", f"checkpoint={tmp_path / 'train'}", f"data.predict_file={dev}"],
                   "predict")["status"] == "ok"
    assert run_job([*common, "action=export", f"checkpoint={tmp_path / 'train'}", f"export.dir={tmp_path / 'hf'}"],
                   "export")["status"] == "ok"
    records = [json.loads(line) for line in (tmp_path / "predict" / "predictions.jsonl").read_text().splitlines()]
    served = in_fresh_python(
        "import transformers\n"
        f"pipe = transformers.pipeline('text-classification', model={str(tmp_path / 'hf')!r}, device='cpu')\n"
        "out = pipe([{'text': a, 'text_pair': b} for a, b in inputs], top_k=None)\n"
        "print(json.dumps([{o['label']: o['score'] for o in scores} for scores in out]))", tmp_path,
        [[r["text"], r["text_pair"]] for r in records])
    assert len(served) == len(records) == 21
    for mine, theirs in zip(records, served):
        assert set(theirs) == set(mine["probabilities"])
        assert all(abs(theirs[k] - p) < 1e-3 for k, p in mine["probabilities"].items()), (mine, theirs)  # 4 decimals


def tiny_model(head: str, kwargs: dict, **options):
    from transformers import BertConfig, BertModel

    from heads.model.kotune_model import KotuneModel

    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return KotuneModel(BertModel(config, add_pooling_layer=False), head, kwargs, **options)


@pytest.mark.parametrize("head,kwargs,options,why", [
    ("token_char", {"num_labels": 3}, {}, "it tags characters, not tokens"),
    ("span_char", {}, {}, "its answer edges are characters inside tokens"),
    ("sequence", {"num_labels": 3}, {"pooling": "mean"}, "mode.pooling=mean: native classifiers read the [CLS] state only"),
    ("sequence", {"num_labels": 3}, {"layers": "scalar_mix"}, "a learned scalar mix has no native form"),
    ("token", {"num_labels": 3}, {"layers": [1, 2]}, "native classes read the last layer only"),
])
def test_heads_without_a_native_equivalent_are_refused_in_one_line(head, kwargs, options, why, tmp_path):
    from kotune.export.native import export_directory
    from kotune.core.errors import ConfigError

    model = tiny_model(head, kwargs, **options)
    model.save(str(tmp_path / "m"))
    with pytest.raises(ConfigError) as e:
        export_directory(str(tmp_path / "m"), str(tmp_path / "hf"))
    assert why in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("cannot export")
    assert not (tmp_path / "hf").exists()


def test_regression_exports_as_a_raw_score(tmp_path):
    """STS (num_labels=1) is exact as problem_type=regression: the pipeline then applies no sigmoid."""
    from kotune.export.native import native_config

    config = native_config(tiny_model("pair", {"num_labels": 1}), ["score"])
    assert config.num_labels == 1 and config.problem_type == "regression"


def test_roberta_pair_export_serves_pairs_without_token_type_ids(tmp_path):
    """RoBERTa has one token type: the exported tokenizer must not send type ids of the second text."""
    import transformers
    from transformers import BertTokenizer, RobertaConfig, RobertaModel

    from heads.model.kotune_model import KotuneModel

    tokenizer = BertTokenizer.from_pretrained(str(shared_path("vocab/kcbert-base")), do_lower_case=False)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, type_vocab_size=1, pad_token_id=0)
    model = KotuneModel(RobertaModel(config, add_pooling_layer=False), "pair", {"num_labels": 3},
                        meta={"labels": ["entailment", "neutral", "contradiction"], "max_length": 128,
                              "token_type_ids": False})
    model.save(str(tmp_path / "m"), tokenizer)
    from kotune.export.native import export_directory

    res = export_directory(str(tmp_path / "m"), str(tmp_path / "hf"))
    assert res["native_class"] == "RobertaForSequenceClassification"
    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), device="cpu")
    out = pipe({"text": "한국어 문장입니다", "text_pair": "두 번째 문장"}, top_k=None)
    enc = tokenizer("한국어 문장입니다", "두 번째 문장", return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        probabilities = model.eval()(**enc)["logits"].softmax(-1)[0]
    served = {o["label"]: o["score"] for o in out}
    assert all(abs(served[n] - float(p)) < 1e-5
               for n, p in zip(["entailment", "neutral", "contradiction"], probabilities))


def test_an_onnx_trace_logs_no_onnx_ir_notes(tmp_path, caplog):
    """onnx_ir's passes note each removed node and each deduplicated initializer at info level (36
    lines for a tiny BERT): quieted while kotune traces, its own level back after."""
    import logging

    from transformers import BertConfig, BertForSequenceClassification

    from kotune.export.onnx import trace_to_onnx

    native = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                      num_attention_heads=2, intermediate_size=32)).eval()
    caplog.set_level(logging.INFO)
    assert trace_to_onnx(native, str(tmp_path / "model.onnx"), ("input_ids", "attention_mask"), ("logits",), 64) > 0
    assert (tmp_path / "model.onnx").is_file()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("onnx_ir")] == []
    assert logging.getLogger("onnx_ir").level == logging.NOTSET
