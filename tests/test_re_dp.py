"""KLUE RE and KLUE DP: reading (span checks, the DP TSV), entity markers and windows, the word
alignment, the dependency head, the pipeline ceiling, and short runs on the sample data and on
../shared."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import compose, shared_path
from tasks import build_task
from tasks.base import EncodeSettings
from tasks.collate import IGNORE
from kotune.core.errors import DataError
from tasks.tagging import Warnings
from tasks.re import entity_window, mark
from test_ner import wordpiece

DP_DEV = "data/klue/klue-dp-v1.1_dev.tsv"
RE_METRICS = {"micro_f1", "auprc"}
DP_METRICS = {"uas_macro_f1", "uas_micro_f1", "las_macro_f1", "las_micro_f1"}


def task(name: str, *overrides: str):
    return build_task(compose([f"task={name}", *overrides]).task)


def re_row(sentence: str, subject: str, obj: str, label: str = "per:spouse", **shift) -> dict:
    s0, o0 = sentence.index(subject) + shift.get("s", 0), sentence.index(obj)
    return {"guid": "g", "sentence": sentence, "label": label,
            "subject_entity": {"word": subject, "start_idx": s0, "end_idx": s0 + len(subject) - 1, "type": "PER"},
            "object_entity": {"word": obj, "start_idx": o0, "end_idx": o0 + len(obj) - 1, "type": "PER"}}


# ---- RE ----------------------------------------------------------------------------------------
def test_markers_surround_entities_in_either_order():
    text, spans = mark("이수아의 남편은 김태민이다.", {"start": 0, "end": 2, "type": "PER"},
                       {"start": 9, "end": 11, "type": "PER"})
    assert text == "@ * PER * 이수아 @의 남편은 # ^ PER ^ 김태민 #이다."
    assert {r: text[a:b] for r, (a, b) in spans.items()} == {"subject": "@ * PER * 이수아 @",
                                                            "object": "# ^ PER ^ 김태민 #"}
    text, spans = mark("이수아의 남편은 김태민이다.", {"start": 9, "end": 11, "type": "PER"},
                       {"start": 0, "end": 2, "type": "PER"})
    assert text.startswith("# ^ PER ^ 이수아 #") and text[spans["subject"][0]] == "@"


def test_span_mismatch_is_counted_and_kept(tmp_path, caplog):
    rows = [re_row("이수아의 남편은 김태민이다.", "이수아", "김태민"),
            re_row("이수아의 남편은 김태민이다.", "이수아", "김태민", s=1)]  # off by one
    path = tmp_path / "re.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    with caplog.at_level("INFO", logger="kotune"):
        examples = task("re").read_file(str(path))
    assert [ex["span_mismatch"] for ex in examples] == [False, True]
    assert examples[1]["subject"]["start"] == 1  # never shifted back
    assert "1 of 2 examples have an entity span that does not match" in caplog.text


def test_re_rejects_unknown_relation_and_bad_span(tmp_path):
    path = tmp_path / "re.json"
    path.write_text(json.dumps([re_row("이수아의 남편은 김태민이다.", "이수아", "김태민", "per:pet")],
                               ensure_ascii=False), encoding="utf-8")
    with pytest.raises(DataError, match="unknown relation 'per:pet'"):
        task("re").read_file(str(path))
    row = re_row("이수아의 남편은 김태민이다.", "이수아", "김태민")
    row["object_entity"]["end_idx"] = 99
    path.write_text(json.dumps([row], ensure_ascii=False), encoding="utf-8")
    with pytest.raises(DataError, match="outside the sentence"):
        task("re").read_file(str(path))


def test_re_reads_hub_rows():
    import datasets

    names = list(compose(["task=re"]).task.labels)
    row = re_row("이수아의 남편은 김태민이다.", "이수아", "김태민")
    row["label"] = names.index("per:spouse")
    features = datasets.Features({
        "guid": datasets.Value("string"), "sentence": datasets.Value("string"),
        "subject_entity": {k: datasets.Value("int32" if k.endswith("idx") else "string")
                           for k in ("word", "start_idx", "end_idx", "type")},
        "object_entity": {k: datasets.Value("int32" if k.endswith("idx") else "string")
                          for k in ("word", "start_idx", "end_idx", "type")},
        "label": datasets.ClassLabel(names=names)})
    rows = datasets.Dataset.from_list([row], features=features)
    [ex] = task("re").read_hub(rows, "klue/klue/re:validation")
    assert ex["label"] == "per:spouse" and ex["object"]["word"] == "김태민"


def test_entity_window_keeps_entities_centred():
    offsets = [(i, i + 1) for i in range(100)]
    assert entity_window(offsets, 40, 45, 200) == (0, 100, True)
    a, b, fits = entity_window(offsets, 40, 45, 20)  # entities are tokens 40..44
    assert fits and b - a == 20 and a <= 40 and b >= 45 and abs((40 - a) - (b - 45)) <= 1
    assert entity_window(offsets, 95, 99, 20)[:2] == (80, 100)  # at the end: the window shifts left
    assert entity_window(offsets, 10, 60, 20) == (10, 30, False)


def test_re_encode_points_at_markers_even_past_max_length():
    filler = "그리고 " * 40
    ex_rows = [re_row(filler + "이수아의 남편은 김태민이다.", "이수아", "김태민")]
    words = ["그리고", "이수아", "##의", "남편", "##은", "김태민", "##이다", "@", "#", "*", "^", "PER", "."]
    tok = wordpiece(words)
    t = task("re")
    examples = [t._example("x", "row 0", r, r["label"], Warnings()) for r in ex_rows]
    features = t.encode(examples, tok, EncodeSettings(max_length=24, token_type_ids=False))
    ids = features["input_ids"][0]
    assert len(ids) <= 24
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens[features["subject_start"][0]] == "@" and tokens[features["object_start"][0]] == "#"
    assert "이수아" in tokens and "김태민" in tokens


def test_re_decode_gives_probabilities():
    t = task("re")
    logits = np.random.default_rng(0).normal(size=(3, len(t.labels)))
    out = t.decode(logits, None, [{}, {}, {}])
    assert all(abs(sum(o["probs"]) - 1) < 1e-9 for o in out)
    assert [o["label"] for o in out] == [t.labels[i] for i in logits.argmax(-1)]


@pytest.mark.parametrize("pooling", ["entity_start", "cls"])
def test_re_sample_run(run_job, pooling):
    res = run_job(["task=re", "model=tiny", "data=sample", f"task.pooling={pooling}", "train.max_steps=3"])
    assert res["status"] == "ok", res.get("error")
    assert set(res["metrics"]) == RE_METRICS and res["main_metric"] == "micro_f1"


# ---- DP ----------------------------------------------------------------------------------------
def test_dp_reads_sample_and_rejects_bad_rows(tmp_path):
    examples = task("dp").read_file("tasks/samples/dp/dev.tsv")
    assert examples[0]["words"] == ["철수가", "책을", "읽었다."]
    assert examples[0]["heads"] == [3, 3, 0] and examples[0]["deprels"] == ["NP_SBJ", "NP_OBJ", "VP"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("## s1\t가 나\n1\t가\t가\tNNG\t2\tNP\n2\t나\t나\tNNG\t0\tWHAT\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.tsv:3: unknown relation 'WHAT'"):
        task("dp").read_file(str(bad))
    bad.write_text("## s1\t가 나\n1\t가\t가\tNNG\t5\tNP\n2\t나\t나\tNNG\t0\tVP\n", encoding="utf-8")
    with pytest.raises(DataError, match="word 1 has head 5"):
        task("dp").read_file(str(bad))


def dp_example(words, heads, deprels):
    return {"id": "s", "source": "t.tsv", "line": 1, "words": words, "heads": heads, "deprels": deprels}


def test_dp_alignment_and_ceiling_with_lost_words():
    t = task("dp")
    tok = wordpiece(["철수", "##가", "책", "##을", "읽", "##었다", "."])
    # 읽었다. → 읽 ##었다 .
    ex = dp_example(["철수가", "책을", "읽었다."], [3, 3, 0], ["NP_SBJ", "NP_OBJ", "VP"])
    features = t.encode([ex], tok, EncodeSettings(max_length=64, token_type_ids=False))
    assert features["token_word"][0] == [IGNORE, 0, 0, 1, 1, 2, 2, 2, IGNORE]
    assert features["heads"][0] == [3, 3, 0]
    scores, report = t.ceiling(features, [ex])
    assert scores["las_macro_f1"] == 100.0 and report["without_state"] == 0
    # max_length 6: [CLS] 철수 ##가 책 ##을 [SEP] -> word 3 is lost; both words' gold head is word 3
    features = t.encode([ex], tok, EncodeSettings(max_length=6, token_type_ids=False))
    assert features["represented"][0] == [True, True, False]
    assert features["heads"][0] == [IGNORE, IGNORE]
    scores, report = t.ceiling(features, [ex])
    assert report["without_state"] == 1 and report["head_without_state"] == 2
    # fallback: word 1 -> 2, word 2 -> 3, word 3 -> root: 2 of 3 heads right
    assert scores["uas_micro_f1"] == pytest.approx(200 / 3)


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_dependency_head_shapes_loss_and_masks(pooling):
    from heads.dependency import DependencyHead

    torch.manual_seed(0)
    head = DependencyHead(16, num_labels=5, word_pooling=pooling, arc_dim=8, label_dim=4)
    hidden = torch.randn(2, 7, 16)
    token_word = torch.tensor([[IGNORE, 0, 0, 1, 2, IGNORE, IGNORE], [IGNORE, 0, 1, IGNORE, IGNORE, IGNORE, IGNORE]])
    heads = torch.tensor([[2, 0, 2], [0, 1, IGNORE]])
    deprels = torch.tensor([[1, 2, 3], [4, 0, IGNORE]])
    arc, labels = head(hidden, None, token_word)
    assert arc.shape == (2, 7, 8) and labels.shape == (2, 7, 8, 5)  # a word slot per token
    assert arc[1, 0, 1] < -1e30 and arc[1, 0, 3] < -1e30  # self arc, and a word that does not exist
    loss = head.loss((arc, labels), heads, deprels)
    loss.backward()
    assert torch.isfinite(loss) and head.arc_weight.grad.abs().sum() > 0
    head.eval()
    pred_heads, pred_labels = head(hidden, None, token_word)
    assert pred_heads.shape == (2, 7) and pred_labels.shape == (2, 7)
    assert (pred_heads[:, :3] != torch.arange(1, 4)).all()  # never its own head
    # on decoded outputs the loss is the labelled-attachment error rate over the 5 gold words
    gold = (heads.clamp(min=0), deprels.clamp(min=0))
    assert float(head.loss(gold, heads, deprels)) == 0.0
    one_label_wrong = (gold[0], gold[1].clone().index_put_((torch.tensor(0), torch.tensor(1)), torch.tensor(4)))
    assert float(head.loss(one_label_wrong, heads, deprels)) == pytest.approx(1 / 5)
    assert float(head.loss((gold[0] + 1, gold[1]), heads, deprels)) == 1.0  # every head wrong


def test_dp_sample_run(run_job):
    res = run_job(["task=dp", "model=tiny", "data=sample", "train.max_steps=3"])
    assert res["status"] == "ok", res.get("error")
    assert set(res["metrics"]) == DP_METRICS and res["main_metric"] == "las_macro_f1"


@pytest.mark.slow
def test_dp_ceiling_on_klue_dev_with_kcbert_vocab(run_job):
    path = shared_path(DP_DEV)
    vocab = shared_path("vocab/kcbert-base")
    res = run_job(["task=dp", "action=ceiling", "model=kcbert", "model.init=random",
                   f"model.name_or_path={vocab}", f"data.validation_file={path}"])
    assert res["status"] == "ok", res.get("error")
    assert res["n_eval"] == 2000 and res["ceiling"]["words"] == 22496
    assert res["metrics"]["las_macro_f1"] == 100.0  # no word is lost at 128 tokens
    short = run_job(["task=dp", "action=ceiling", "model=kcbert", "model.init=random", "train.max_length=32",
                     f"model.name_or_path={vocab}", f"data.validation_file={path}"], name="short")
    assert short["ceiling"]["without_state"] > 0 and short["metrics"]["las_macro_f1"] < 100.0


@pytest.mark.slow
def test_dp_short_real_run_learns_attachments(run_job):
    """A few dozen steps on a seeded 80/20 split of KLUE DP dev: the parser must beat attaching
    every word to the sentence's last word (UAS micro 28.3 on this file)."""
    path = shared_path(DP_DEV)
    res = run_job(["task=dp", "model=tiny", f"data.train_file={path}", "data.validation_split=0.2",
                   "data.max_train_samples=400", "train.max_steps=40", "train.learning_rate=1e-3"])
    assert res["status"] == "ok", res.get("error")
    assert res["n_eval"] == 400 and set(res["metrics"]) == DP_METRICS
    assert res["metrics"]["uas_micro_f1"] > 35.0
