"""Documents longer than the encoder (``task.long_text=windows``): windows that overlap by
``task.window_stride``, a pair windowing its second text, the document's logits pooled over its
windows by the model as ``task.window_pool`` says (in training too), memory bounded by
``task.max_windows_per_batch``, and the exported model's recipe in docs/long-documents.md giving
kotune's predictions.

The end-to-end test reads synthetic documents whose only label-bearing words sit past
``max_length``: truncation sees none of them (chance), windows see all of them."""
from __future__ import annotations

import json
import random
import re

import pytest

from conftest import ROOT, compose

FILLER = "오늘 내일 회의 자료 정리 사람 시간 장소 계획 보고 일정 확인 준비 결과 내용 문서 작성 검토 공유 요청".split()
LABEL_WORDS = {"과일": ["사과", "포도", "수박"], "차량": ["버스", "기차", "택시"]}
MAX_LENGTH = 16  # 14 words: the label words sit at words 20-39


def documents(n: int, seed: int) -> str:
    """A TSV of ``n`` documents of 40 words, balanced: filler everywhere, three words of the label's
    set among words 20-39 (past max_length), none before."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        label = sorted(LABEL_WORDS)[i % 2]
        words = [rng.choice(FILLER) for _ in range(40)]
        for position in rng.sample(range(20, 40), 3):
            words[position] = rng.choice(LABEL_WORDS[label])
        rows.append(f"{' '.join(words)}\t{label}")
    return "text\tlabel\n" + "\n".join(rows) + "\n"


def docs_recipe() -> dict:
    """The recipe's code block in docs/long-documents.md, run: its namespace."""
    text = (ROOT / "docs" / "long-documents.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def predict_document" in b)
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 - the project's own documentation
    return namespace


def test_windows_read_what_truncation_cannot_and_the_export_recipe_agrees(run_job, tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text(documents(160, 1), encoding="utf-8")
    dev.write_text(documents(80, 2), encoding="utf-8")
    data = ["task=text_cls", "model=tiny", f"data.train_file={train}", f"data.validation_file={dev}",
            f"train.max_length={MAX_LENGTH}", "train.batch_size=16", "train.max_steps=60"]
    windows = ["task.long_text=windows", "task.window_stride=4", "task.max_windows_per_batch=48"]
    truncated = run_job(data, "truncate")
    windowed = run_job(data + windows, "windows")
    assert truncated["status"] == windowed["status"] == "ok", (truncated.get("error"), windowed.get("error"))
    assert truncated["metrics"]["accuracy"] <= 65.0  # chance is 50: the label words are all cut off
    assert windowed["metrics"]["accuracy"] >= 95.0

    # the checkpoint's saved windowing is used when eval does not repeat it (task.long_text is "saved")
    evaluated = run_job(data + ["action=eval", f"checkpoint={tmp_path / 'windows'}"], "eval")
    assert evaluated["status"] == "ok" and evaluated["metrics"] == pytest.approx(windowed["metrics"])

    exported = run_job(data + ["action=export", f"checkpoint={tmp_path / 'windows'}"], "export")
    assert exported["status"] == "ok", exported.get("error")
    assert "windows" in exported["input_note"]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(exported["export_dir"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported["export_dir"])
    assert model.config.kotune_windows == {"stride": 4, "pool": "mean"}
    predict_document = docs_recipe()["predict_document"]
    kotune = [json.loads(line) for line in (tmp_path / "windows" / "predictions.jsonl").read_text().splitlines()]
    texts = [line.split("\t")[0] for line in dev.read_text(encoding="utf-8").splitlines()[1:]]
    assert [predict_document(model, tokenizer, text) for text in texts] == [row["prediction"] for row in kotune]


def test_windows_share_the_stride_and_a_pair_keeps_its_first_text_in_each(tmp_path):
    from transformers import BertTokenizerFast

    from kotune.core.errors import ConfigError, DataError
    from tasks.windows import WindowOptions, encode_windows

    words = [f"w{i}" for i in range(30)]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])})
    doc = {"id": "d0", "text": " ".join(words[:20])}
    options = WindowOptions(stride=2, pool="mean", max_per_batch=8)
    windows = encode_windows(tokenizer, [doc], False, 8, options, True)["input_ids"][0]
    content = [tokenizer.convert_ids_to_tokens(w)[1:-1] for w in windows]
    assert content[0] == words[:6] and all(a[-2:] == b[:2] for a, b in zip(content, content[1:]))
    assert [t for w in content for t in w[2:]] == words[2:20]  # every token, in order, once past the overlap

    pair = {"id": "p0", "text": "w25 w26", "text_pair": " ".join(words[:10])}
    enc = encode_windows(tokenizer, [pair], True, 9, options, True)
    seen = [tokenizer.convert_ids_to_tokens(w) for w in enc["input_ids"][0]]
    assert len(seen) > 1 and all(w[:4] == ["[CLS]", "w25", "w26", "[SEP]"] for w in seen)
    assert all(types[:4] == [0, 0, 0, 0] and set(types[4:]) == {1} for types in enc["token_type_ids"][0])

    too_long = dict(pair, id="train.jsonl:7", text=" ".join(words[20:25]))
    with pytest.raises(DataError, match=r"train.jsonl:7.*first text takes 5 of max_length=9"):
        encode_windows(tokenizer, [too_long], True, 9, options, True)
    with pytest.raises(ConfigError, match="task.window_stride=6 must be smaller than the 6 tokens"):
        encode_windows(tokenizer, [doc], False, 8, WindowOptions(6, "mean", 8), True)


def test_the_collator_batches_documents_as_windows():
    from tasks.collate import DynamicPaddingCollator

    rows = [{"input_ids": [[2, 5, 6, 3], [2, 7, 3]], "attention_mask": [[1, 1, 1, 1], [1, 1, 1]], "labels": 1},
            {"input_ids": [[2, 8, 3]], "attention_mask": [[1, 1, 1]], "labels": 0}]
    batch = DynamicPaddingCollator(0, 1)(rows)
    assert batch["input_ids"].tolist() == [[2, 5, 6, 3], [2, 7, 3, 0], [2, 8, 3, 0]]
    assert batch["window_doc"].tolist() == [0, 0, 1] and batch["labels"].tolist() == [1, 0]


def test_pooling_takes_the_mean_or_max_of_each_documents_windows():
    import torch

    from heads.model.windows import pool_windows

    logits = torch.tensor([[1.0, 4.0], [3.0, 0.0], [5.0, 5.0]], requires_grad=True)
    doc = torch.tensor([0, 0, 1])
    assert pool_windows(logits, doc, "mean").tolist() == [[2.0, 2.0], [5.0, 5.0]]
    assert pool_windows(logits, doc, "max").tolist() == [[3.0, 4.0], [5.0, 5.0]]
    pool_windows(logits, doc, "mean").sum().backward()
    assert logits.grad.tolist() == [[0.5, 0.5], [0.5, 0.5], [1.0, 1.0]]


def test_the_built_model_pools_its_windows_as_task_window_pool_says(tmp_path, cache_dir):
    """Through the model kotune builds from the config: each document's logits are the mean or the
    max (``task.window_pool``) of its windows' logits, each window run through the model alone and
    pooled by hand here. The two pools differ on these documents, so a model that ignored the option
    (always the mean) fails one of them — the pooling function's own test cannot see that."""
    import torch

    from kotune.loading.build import build

    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text(documents(16, 1), encoding="utf-8")
    dev.write_text(documents(6, 2), encoding="utf-8")
    logits: dict[str, torch.Tensor] = {}
    for pool in ("mean", "max"):
        cfg = compose(["task=text_cls", "model=tiny", f"data.train_file={train}", f"data.validation_file={dev}",
                       f"train.max_length={MAX_LENGTH}", "task.long_text=windows", "task.window_stride=4",
                       f"task.window_pool={pool}", f"cache_dir={cache_dir}"])
        b = build(cfg, ("train", "validation"))  # the same seed: the same weights for both pools
        model, rows = b.model.eval(), list(b.inputs["validation"])
        with torch.no_grad():  # a random encoder reads all windows alike: the head's output layer spreads them
            [m for m in model.head.modules() if isinstance(m, torch.nn.Linear)][-1].weight.mul_(10.0)
        batch = b.collator(rows)
        assert batch["window_doc"].tolist() != list(range(len(rows)))  # documents of several windows
        with torch.no_grad():
            logits[pool] = model(**batch)["logits"]
            by_hand = []
            for row in rows:  # each window alone, no window_doc: the plain sequence path
                windows = torch.cat([model(**{k: torch.tensor([row[k][w]]) for k in row if k != "labels"})["logits"]
                                     for w in range(len(row["input_ids"]))])
                by_hand.append(windows.mean(0) if pool == "mean" else windows.max(0).values)
        assert logits[pool].shape == (len(rows), 2)
        assert torch.allclose(logits[pool], torch.stack(by_hand), atol=1e-5, rtol=0), \
            f"task.window_pool={pool}: the model's document logits are not the {pool} of its windows'"
    assert float((logits["mean"] - logits["max"]).abs().min()) > 1e-4  # every document, every label: 10x the tolerance


def test_the_encoder_never_reads_more_windows_than_the_cap_and_gradients_stay_exact():
    import torch
    from transformers import BertConfig, BertModel

    from heads.model.kotune_model import KotuneModel
    from tasks.windows import WindowOptions

    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = KotuneModel(BertModel(config, add_pooling_layer=False), "sequence", {"num_labels": 2}).train()
    seen: list[int] = []
    model.encoder.register_forward_hook(lambda module, args, kwargs, output: seen.append(kwargs["input_ids"].size(0)),
                                        with_kwargs=True)
    batch = {"input_ids": torch.randint(4, 40, (10, 6)), "attention_mask": torch.ones(10, 6, dtype=torch.long),
             "window_doc": torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 2]), "labels": torch.tensor([1, 0, 1])}

    def gradients(cap: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.windows = WindowOptions(stride=0, pool="mean", max_per_batch=cap)
        model.zero_grad()
        out = model(**batch)
        out["loss"].backward()
        return out["logits"].detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole_logits, whole = gradients(100)
    assert seen == [10]
    seen.clear()
    capped_logits, capped = gradients(3)
    assert seen and max(seen) <= 3 and len(seen) > 4  # four chunks forward, recomputed in the backward pass
    assert capped_logits.shape == (3, 2) and torch.allclose(capped_logits, whole_logits, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(capped, whole))


def test_windows_on_a_task_that_does_not_classify_documents_are_refused_in_one_line(run_job):
    res = run_job(["task=ner", "model=tiny", "data=sample", "task.long_text=windows"], "ner")
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert "task.long_text=windows: task ner has no such option" in res["error"] and "text_cls" in res["error"]
    frozen = run_job(["task=text_cls", "model=tiny", "data=sample", "mode=frozen", "task.long_text=windows"], "frozen")
    assert frozen["status"] == "failed" and "mode.cache=false" in frozen["error"]
