"""Span QA (tasks/qa.py, heads/span.py): windows on hand-made contexts longer than one window,
n-best decoding, null answers, character-exact boundaries, the pipeline ceiling, bad input, the
official metrics, and real-data runs on KorQuAD 1.0 dev."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import compose, shared_path

# ---- a hand-built WordPiece tokenizer: every filler word is one token -------------------------
FILLER = list("가나다라마바사아자차카타파하")
QUESTION = "누가 갔나?"
# 임수경은 → 임수 ##경은: no token edge after 경
PIECES = ["임수", "##경은", "서울", "##에", "평양"]


def hand_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(FILLER) + QUESTION + "".join(PIECES).replace("#", "") + "수경은에") - {" "})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars] + PIECES
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(dict.fromkeys(vocab))}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                            special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def context_with(answer_word: str, at: int, n_words: int = 40) -> tuple[str, int]:
    """Filler words (one token each) with ``answer_word`` as word number ``at``; returns the
    context and the answer word's character offset."""
    words = [FILLER[i % len(FILLER)] for i in range(n_words)]
    words.insert(at, answer_word)
    return " ".join(words), sum(len(w) + 1 for w in words[:at])


def make_task(name: str = "korquad", **options):
    from omegaconf import OmegaConf

    from tasks import build_task

    cfg = compose([f"task={name}"]).task
    return build_task(OmegaConf.merge(cfg, options))


def example(qid: str, context: str, answers: list[tuple[str, int]], impossible: bool = False) -> dict:
    return {"id": qid, "question": QUESTION, "context": context, "title": "", "impossible": impossible,
            "question_type": 3 if impossible else 1, "labeled": True,
            "answers": [{"text": t, "answer_start": s, "valid": context[s:s + len(t)] == t} for t, s in answers]}


def encode(task, examples, max_length: int = 24):
    from tasks.base import EncodeSettings

    return task.encode(examples, hand_tokenizer(), EncodeSettings(max_length=max_length, token_type_ids=True))


def rows_of(features, k: int) -> list[int]:
    return [i for i, e in enumerate(features["example_index"]) if e == k]


def span_text(features, i: int, ex: dict, char: bool) -> str:
    s, e = features[i]["start_positions"], features[i]["end_positions"]
    if char:
        pos = features[i]["char_position"]
        return ex["context"][pos[s]:pos[e] + 1]
    return ex["context"][features[i]["token_start"][s]:features[i]["token_end"][e]]


# ---- windows ---------------------------------------------------------------------------------
# max_length 24, question 누 ##가 갔 ##나 ? (5 tokens) + 3 specials: 16 context tokens per window;
# doc_stride 6: windows start at context tokens 0, 10, 20, 30 (tokens 10-15 are in windows 0 and 1)


def test_answer_in_the_overlap_is_a_target_in_both_windows():
    context, at = context_with("서울", 12)
    ex = example("q", context, [("서울", at)])
    for decode in ("token", "char"):
        task = make_task(doc_stride=6, decode=decode)
        feats = encode(task, [ex])
        rows = rows_of(feats, 0)
        assert len(rows) == 4  # 41 context tokens
        holding = [i for i in rows if feats[i]["start_positions"] > 0]
        assert holding == rows[:2]
        for i in holding:
            assert span_text(feats, i, ex, decode == "char") == "서울"
        assert all(feats[i]["start_positions"] == feats[i]["end_positions"] == 0 for i in rows[2:])
        char_inputs = {"char_token_index", "char_in_token"} if decode == "char" else set()
        assert set(task.model_columns(feats)) == {"input_ids", "attention_mask", "token_type_ids",
                                                  "start_positions", "end_positions"} | char_inputs


def test_answer_split_across_windows_points_at_cls_where_it_is_cut():
    # answer tokens 15-17 (서울 ##에 + 갔): window 0 ends at token 15, window 1 (10-25) holds it
    context, at = context_with("서울에 갔", 15)
    ex = example("q", context, [("서울에 갔", at)])
    task = make_task(doc_stride=6)
    feats = encode(task, [ex])
    rows = rows_of(feats, 0)
    assert (feats[rows[0]]["start_positions"], feats[rows[0]]["end_positions"]) == (0, 0)
    assert span_text(feats, rows[1], ex, False) == "서울에 갔"
    # no overlap at all: no window holds the whole answer → lost to windows, and counted
    no_overlap = make_task(doc_stride=0)
    feats = encode(no_overlap, [ex])
    assert all(feats[i]["start_positions"] == 0 for i in rows_of(feats, 0))
    _, report = no_overlap.ceiling(feats, [ex])
    assert report["answers_lost_to_windows"] == 1 and report["lost_ids"] == ["q"]
    _, report = task.ceiling(encode(task, [ex]), [ex])
    assert report["answers_lost_to_windows"] == 0 and report["exact_string_in_windows"] == 1


def test_unanswerable_points_every_window_at_cls_and_decodes_to_null():
    context, _ = context_with("서울", 5)
    impossible = example("u", context, [], impossible=True)
    task = make_task("mrc", doc_stride=6)
    feats = encode(task, [impossible])
    assert all(feats[i]["start_positions"] == feats[i]["end_positions"] == 0 for i in rows_of(feats, 0))
    metrics, report = task.ceiling(feats, [impossible])
    assert metrics["exact_match"] == 100.0 and report["unanswerable"] == 1


def test_rejected_answers_are_never_targets_and_never_shifted():
    context, at = context_with("서울", 12)
    ex = example("q", context, [("서울", at + 1)])  # off by one: not the text at that offset
    assert not ex["answers"][0]["valid"]
    feats = encode(make_task(doc_stride=6), [ex])
    assert all(feats[i]["start_positions"] == feats[i]["end_positions"] == -100 for i in rows_of(feats, 0))


def test_too_long_questions_are_cut_and_stride_must_fit():
    from kotune.core.errors import ConfigError

    context, at = context_with("서울", 3)
    ex = dict(example("q", context, [("서울", at)]), question="누가 " * 30 + "갔나?")
    task = make_task(doc_stride=4, max_question_length=6)
    feats = encode(task, [ex], max_length=24)
    assert feats[0]["token_type_ids"].count(0) == 6 + 2  # [CLS] 6 question tokens [SEP]
    with pytest.raises(ConfigError, match="doc_stride"):
        encode(make_task(doc_stride=20), [ex], max_length=24)


# ---- decoding --------------------------------------------------------------------------------
def logits_for(features, picks: dict[int, dict[str, dict[int, float]]], char: bool = False, pad: int = 0):
    """Trainer-shaped predictions: (start, end) arrays padded with -100 past each row (and ``pad``
    extra columns, as Trainer pads across batches); ``picks[row]['start'|'end'][position] = logit``."""
    lengths = [len(r) for r in (features["char_position"] if char else features["token_start"])]
    out = []
    for side in ("start", "end"):
        arr = np.full((len(lengths), max(lengths) + pad), -100.0, dtype=np.float32)
        for i, n in enumerate(lengths):
            arr[i, :n] = 0.0
            for pos, value in picks.get(i, {}).get(side, {}).items():
                arr[i, pos] = value
        out.append(arr)
    return tuple(out)


def token_index(features, i: int, char_offset: int) -> int:
    return next(k for k, s in enumerate(features[i]["token_start"]) if s == char_offset)


def test_nbest_across_windows_context_only_and_max_answer_length():
    context, at = context_with("서울", 12)
    ex = example("q", context, [("서울", at)])
    task = make_task(doc_stride=6, max_answer_length=3, n_best=5)
    feats = encode(task, [ex])
    w0, w1 = rows_of(feats, 0)[:2]
    seoul0, seoul1 = token_index(feats, w0, at), token_index(feats, w1, at)
    far = token_index(feats, w1, at + 3 + 2 * 4)  # 5 tokens after 서울: over max_answer_length
    picks = {
        w0: {"start": {1: 50.0, seoul0: 3.5}, "end": {2: 50.0, seoul0: 3.5}},  # question tokens: ignored
        w1: {"start": {seoul1: 5.0}, "end": {seoul1: 3.0, far: 9.0}},           # 서울..far too long
    }
    preds = logits_for(feats, picks, pad=5)
    out = task.decode(preds, feats, [ex])[0]
    assert out["answer"] == "서울"
    assert out["nbest"][0]["score"] == 8.0  # window 1's 5 + 3 beats window 0's 3.5 + 3.5; one entry per span
    assert [c["text"] for c in out["nbest"]].count("서울") == 1
    assert all(len(c["text"].split()) <= 3 for c in out["nbest"])
    assert math.isclose(sum(c["probability"] for c in out["nbest"]), 1.0)
    assert "null_score_diff" not in out  # korquad: no null answer


def test_null_answer_threshold():
    context, at = context_with("서울", 12)
    ex = example("q", context, [("서울", at)])
    for name, null_ok in (("mrc", True), ("korquad", False)):
        for threshold, expect_null in ((0.0, True), (5.0, False)):
            task = make_task(name, doc_stride=6, null_threshold=threshold)
            feats = encode(task, [ex])
            rows = rows_of(feats, 0)
            seoul = token_index(feats, rows[0], at)
            # every window's null score is 3 + 3 = 6; the span scores 2 + 2 = 4: diff 2
            picks = {i: {"start": {0: 3.0}, "end": {0: 3.0}} for i in rows}
            picks[rows[0]]["start"][seoul] = picks[rows[0]]["end"][seoul] = 2.0
            out = task.decode(logits_for(feats, picks), feats, [ex])[0]
            assert out["answer"] == ("" if null_ok and expect_null else "서울"), (name, threshold)
            if null_ok:
                assert out["null_score_diff"] == 2.0


def test_decode_refuses_predictions_of_another_decoding():
    from kotune.core.errors import KotuneError

    context = " ".join(["서울"] * 40)  # two characters per token: more character slots than tokens
    ex = example("q", context, [("서울", 3)])
    token_task, char_task = make_task(doc_stride=6), make_task(doc_stride=6, decode="char")
    with pytest.raises(KotuneError, match="task.decode"):
        char_task.decode(logits_for(encode(token_task, [ex]), {}), encode(char_task, [ex]), [ex])


# ---- character-exact boundaries ----------------------------------------------------------------
def test_char_decoding_expresses_what_token_decoding_cannot():
    context, at = context_with("임수경은", 12)
    ex = example("q", context, [("임수경", at)])
    token_task, char_task = make_task(doc_stride=6), make_task(doc_stride=6, decode="char")
    tok_feats, char_feats = encode(token_task, [ex]), encode(char_task, [ex])
    row = rows_of(tok_feats, 0)[0]
    assert span_text(tok_feats, row, ex, False) == "임수경은"  # the best any token span can do
    assert span_text(char_feats, row, ex, True) == "임수경"
    tok_metrics, tok_report = token_task.ceiling(tok_feats, [ex])
    char_metrics, char_report = char_task.ceiling(char_feats, [ex])
    assert tok_report["answers_with_edge_inside_token"] == char_report["answers_with_edge_inside_token"] == 1
    assert tok_metrics["exact_match"] == 0.0 and char_metrics["exact_match"] == 100.0
    # a head that tells apart only one position per token cannot place an edge inside 임수:
    # the ceiling reproduces the tie the model would face, and reports it
    ex2 = example("q2", context, [("수경", at + 1)])
    narrow = make_task(doc_stride=6, decode="char", max_token_chars=1)
    metrics, report = narrow.ceiling(encode(narrow, [ex2]), [ex2])
    assert report["answers_with_edge_past_max_token_chars"] == 1 and metrics["exact_match"] == 0.0


def test_char_slots_cover_each_context_character_once():
    from tasks.qa import _char_slots

    # token 0 is [CLS]; tokens 1-2 are context; token 3 shares character 4 with token 2 (byte BPE)
    index, rank, position = _char_slots([-1, 0, 3, 4, -1], [-1, 2, 5, 5, -1])
    assert position == [-1, 0, 1, 3, 4]  # character 2 (a space) is in no token
    assert index == [0, 1, 1, 2, 2] and rank == [0, 0, 1, 0, 1]


# ---- heads -----------------------------------------------------------------------------------
def test_span_head_masks_padding_and_ignores_rejected_targets():
    from heads.span import MASKED, SpanHead

    torch.manual_seed(0)
    head = SpanHead(8, dropout=0.0)
    hidden, mask = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    start, end = head(hidden, mask)
    assert start.shape == end.shape == (2, 5) and (start[1, 3:] == MASKED).all()
    loss = head.loss((start, end), torch.tensor([2, -100]), torch.tensor([3, -100]))
    expected = (torch.nn.functional.cross_entropy(start[:1], torch.tensor([2]))
                + torch.nn.functional.cross_entropy(end[:1], torch.tensor([3]))) / 2
    assert torch.isclose(loss, expected)
    nothing = head.loss((start, end), torch.tensor([-100, -100]), torch.tensor([-100, -100]))
    assert nothing.item() == 0.0 and nothing.requires_grad


def test_char_head_scores_are_token_plus_offset_logits():
    from heads.span import MASKED, SpanHead

    torch.manual_seed(0)
    head = SpanHead(6, max_token_chars=3, dropout=0.0, units="char")
    torch.nn.init.normal_(head.offset.weight)
    hidden, mask = torch.randn(1, 4, 6), torch.ones(1, 4, dtype=torch.long)
    # slots: [CLS], token 1 with 2 characters, token 2 with 4 characters (past max_token_chars=3), padding
    index = torch.tensor([[0, 1, 1, 2, 2, 2, 2, -100]])
    rank = torch.tensor([[0, 0, 1, 0, 1, 2, 3, -100]])
    start, end = head(hidden, mask, index, rank)
    tok, off = head.token(hidden)[0], head.offset(hidden)[0].view(4, 2, 3)
    from_end = [0, 1, 0, 3, 2, 1, 0]
    for slot in range(7):
        t, r = index[0, slot].item(), rank[0, slot].item()
        assert torch.isclose(start[0, slot], tok[t, 0] + off[t, 0, min(r, 2)])
        assert torch.isclose(end[0, slot], tok[t, 1] + off[t, 1, min(from_end[slot], 2)])
    assert start[0, 7] == MASKED and end[0, 7] == MASKED


def test_char_head_learns_an_edge_inside_a_token():
    """From token states alone (no characters), the head learns to end 임수경 before 은."""
    from heads.span import SpanHead

    torch.manual_seed(0)
    head = SpanHead(16, max_token_chars=4, dropout=0.0, units="char")
    hidden, mask = torch.randn(8, 3, 16), torch.ones(8, 3, dtype=torch.long)
    index = torch.tensor([[0, 1, 1, 2, 2]] * 8)  # 임수 | 경은
    rank = torch.tensor([[0, 0, 1, 0, 1]] * 8)
    gold_start, gold_end = torch.full((8,), 1), torch.full((8,), 3)  # 임 … 경
    opt = torch.optim.Adam(head.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        loss = head.loss(head(hidden, mask, index, rank), gold_start, gold_end)
        loss.backward()
        opt.step()
    start, end = head(hidden, mask, index, rank)
    assert (start.argmax(-1) == 1).all() and (end.argmax(-1) == 3).all()


# ---- reading and bad input --------------------------------------------------------------------
def squad_file(tmp_path: Path, qas: list[dict], context: str = "세종은 조선의 왕이다. 서울에 살았다.",
               name: str = "data.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"version": "t", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}, ensure_ascii=False), encoding="utf-8")
    return str(path)


def qa(qid: str, text: str = "세종", start: int = 0, **extra) -> dict:
    return dict({"id": qid, "question": "누구?", "answers": [{"text": text, "answer_start": start}]}, **extra)


@pytest.mark.parametrize("qas, context, message", [
    ([{"id": "a", "answers": []}], None, "a: empty or missing question"),
    ([{"question": "누구?", "answers": []}], None, "missing field 'id'"),
    ([qa("a")], "   ", "a: empty or missing context"),
    ([qa("a"), qa("a")], None, "a: duplicate question id"),
    ([qa("a", start="0")], None, "a: answer 0: answer_start must be an integer"),
    ([dict(qa("a"), answers=[{"text": "세종"}])], None, "a: answer 0: missing field"),
    ([qa("a"), {"id": "b", "question": "왜?", "answers": []}], None, "b: answerable question .* without answers"),
    ([qa("a"), {"id": "u", "question": "왜?", "answers": [], "is_impossible": True}], None,
     "u: unanswerable question, but task korquad takes no null answers"),
])
def test_bad_input_is_one_line_naming_file_and_id(tmp_path, qas, context, message):
    from kotune.core.errors import DataError

    path = squad_file(tmp_path, qas, **({"context": context} if context is not None else {}))
    with pytest.raises(DataError, match=message) as err:
        make_task("korquad").read_file(path)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_mismatched_answers_are_counted_reported_and_kept_for_scoring(tmp_path, capsys):
    path = squad_file(tmp_path, [qa("ok"), qa("shifted", start=1), qa("outside", start=99),
                                 dict(qa("two"), answers=[{"text": "세종", "answer_start": 5},
                                                          {"text": "서울", "answer_start": 13}])])
    examples = make_task("korquad").read_file(path)
    line = [x for x in capsys.readouterr().out.splitlines() if "do not match" in x]
    assert len(line) == 1 and path in line[0] and "3 gold answer(s)" in line[0]
    assert "shifted" in line[0] and "outside" in line[0] and "(2 question(s) left without one" in line[0]
    by_id = {ex["id"]: ex for ex in examples}
    assert [a["valid"] for a in by_id["two"]["answers"]] == [False, True]
    assert by_id["shifted"]["answers"][0]["answer_start"] == 1  # never shifted


def test_klue_json_plausible_answers_are_never_gold(tmp_path):
    path = squad_file(tmp_path, [
        {"guid": "klue-1", "question": "누구?", "question_type": 1, "is_impossible": False,
         "answers": [{"text": "세종", "answer_start": 0}], "plausible_answers": []},
        {"guid": "klue-2", "question": "언제?", "question_type": 3, "is_impossible": True,
         "answers": [], "plausible_answers": [{"text": "서울", "answer_start": 13}]},
    ])
    task = make_task("mrc")
    examples = task.read_file(path)
    assert [ex["id"] for ex in examples] == ["klue-1", "klue-2"]
    assert examples[1]["impossible"] and examples[1]["answers"] == []
    # predicting the plausible answer is wrong; predicting nothing is right
    out = task.score([{"answer": "세종"}, {"answer": "서울"}], examples)
    assert out["exact_match"] == 50.0 and out["exact_match_type3"] == 0.0
    out = task.score([{"answer": "세종"}, {"answer": ""}], examples)
    assert out["exact_match"] == out["rouge_w"] == 100.0


def test_hub_rows_and_flat_jsonl_read_alike(tmp_path, capsys):
    import datasets

    context = "세종은 조선의 왕이다."
    rows = datasets.Dataset.from_list([
        {"guid": "h1", "context": context, "question": "누구?", "is_impossible": False, "question_type": 1,
         "title": "t", "answers": {"answer_start": [0], "text": ["세종"]}},
        {"guid": "h2", "context": context, "question": "왜?", "is_impossible": True, "question_type": 3,
         "title": "t", "answers": {"answer_start": [], "text": []}}])
    hub = make_task("mrc").read_hub(rows, "klue/klue/mrc:validation")
    assert "warning" not in capsys.readouterr().out  # empty answer lists of an unanswerable row are no answers
    flat = tmp_path / "rows.jsonl"
    flat.write_text("\n".join(json.dumps(dict(r), ensure_ascii=False) for r in rows), encoding="utf-8")
    assert make_task("mrc").read_file(str(flat)) == hub
    assert hub[0]["answers"] == [{"text": "세종", "answer_start": 0, "valid": True}] and hub[1]["impossible"]


def test_generic_qa_follows_the_data(tmp_path):
    v2 = squad_file(tmp_path, [qa("a"), {"id": "u", "question": "왜?", "answers": [], "is_impossible": True}])
    task = make_task("qa")
    train = task.read_file(v2)
    task.fit_labels(train)
    assert task.allow_null is True
    assert set(task.score([{"answer": "세종"}, {"answer": ""}], train)) == {"exact_match", "rouge_w"}
    v1 = make_task("qa")
    v1_examples = v1.read_file(squad_file(tmp_path, [qa("a")], name="v1.json"))
    v1.fit_labels(v1_examples)
    assert v1.allow_null is False
    assert set(v1.score([{"answer": "세종"}], v1_examples)) == {"exact_match", "f1"}


# ---- official metrics ------------------------------------------------------------------------
def official():
    """KorQuAD 1.0 evaluate-v1.0.py as transcribed in tests/test_metrics.py."""
    spec = importlib.util.spec_from_file_location("qa_official_metrics", Path(__file__).with_name("test_metrics.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def official_golds(dataset: dict) -> dict[str, list[str]]:
    """The script's own loop over a SQuAD file."""
    return {q["id"]: [a["text"] for a in q["answers"]]
            for article in dataset["data"] for p in article["paragraphs"] for q in p["qas"]}


def test_reported_korquad_scores_equal_the_official_script(tmp_path):
    ref = official()
    qas, parts, offset = [], [], 0
    for i, (_, golds) in enumerate(ref.KORQUAD_PAIRS):  # punctuation, spaces, 《》, empty predictions
        answers = []
        for g in golds:
            answers.append({"text": g, "answer_start": offset})
            parts.append(g)
            offset += len(g) + 3
        qas.append({"id": f"q{i}", "question": "무엇?", "answers": answers})
    context = " | ".join(parts)
    path = squad_file(tmp_path, qas, context=context)
    predictions = {f"q{i}": p for i, (p, _) in enumerate(ref.KORQUAD_PAIRS)}
    (tmp_path / "predictions.json").write_text(json.dumps(predictions, ensure_ascii=False), encoding="utf-8")
    task = make_task("korquad")
    examples = task.read_file(path)
    assert all(a["valid"] for ex in examples for a in ex["answers"])
    file_predictions = json.loads((tmp_path / "predictions.json").read_text(encoding="utf-8"))
    reported = task.score([{"answer": file_predictions[ex["id"]]} for ex in examples], examples)
    expected = ref._official_evaluate(official_golds(json.loads(Path(path).read_text(encoding="utf-8"))),
                                      file_predictions)
    assert reported["exact_match"] == pytest.approx(expected["exact_match"], abs=1e-6)
    assert reported["f1"] == pytest.approx(expected["f1"], abs=1e-6)
    assert 0 < expected["exact_match"] < 100 and 0 < expected["f1"] < 100


def test_klue_mrc_scores_golden_values(tmp_path):
    context = "《해리 포터》는 영국 소설이다. 서울(한국)에서 팔렸다."
    path = squad_file(tmp_path, [
        {"guid": "a", "question": "책?", "question_type": 1,
         "answers": [{"text": "《해리 포터》", "answer_start": 0}]},
        {"guid": "b", "question": "어디?", "question_type": 2,
         "answers": [{"text": "서울(한국)", "answer_start": context.index("서울")}]},
        {"guid": "c", "question": "언제?", "question_type": 3, "is_impossible": True, "answers": []},
    ], context=context)
    task = make_task("mrc")
    examples = task.read_file(path)
    # a: "해리 포터" vs "《해리 포터》" (KLUE keeps 《》): EM 0, LCCS 5 → P 1, R 5/7 → 10/12
    # b: "서울 한국" vs "서울한국" (KLUE deletes () without a space): EM 0, LCCS 2 → P 2/5, R 2/4 → 4/9
    # c: "" for an unanswerable question: 1
    out = task.score([{"answer": "해리 포터"}, {"answer": "서울 한국"}, {"answer": ""}], examples)
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["rouge_w"] == pytest.approx(100 * (10 / 12 + 4 / 9 + 1) / 3)
    assert out["rouge_w_type2"] == pytest.approx(400 / 9) and out["exact_match_type3"] == 100.0


# ---- end to end ------------------------------------------------------------------------------
def test_tiny_mrc_on_samples_writes_predictions_json_and_reloads(run_job, tmp_path):
    options = ["task=mrc", "model=tiny", "data=sample", "task.decode=char"]
    res = run_job(options + ["train.max_steps=3", "train.batch_size=8", "task.write_nbest=true"], "train")
    assert res["status"] == "ok", res.get("error")
    assert {"exact_match", "rouge_w", "exact_match_type3"} <= set(res["metrics"])
    assert res["max_length"] == 510  # task.max_length (KLUE-baseline's MRC windows), not train.max_length
    predictions = json.loads((tmp_path / "train" / "predictions.json").read_text(encoding="utf-8"))
    nbest = json.loads((tmp_path / "train" / "nbest_predictions.json").read_text(encoding="utf-8"))
    assert len(predictions) == res["n_eval"] == len(nbest)
    records = [json.loads(line) for line in (tmp_path / "train" / "predictions.jsonl").read_text().splitlines()]
    assert predictions == {r["id"]: r["prediction"] for r in records}  # the official file says what kotune scored
    assert all(a == "" or a == nbest[q][0]["text"] for q, a in predictions.items())  # the best span, or null
    again = run_job(options + ["action=eval", f"checkpoint={tmp_path / 'train'}"], "eval")
    assert again["metrics"] == pytest.approx(res["metrics"])
    assert json.loads((tmp_path / "eval" / "predictions.json").read_text(encoding="utf-8")) == predictions
    # task.decode not given: the checkpoint's char decoding applies; token decoding given: refused, naming the head
    remembered = run_job(["task=mrc", "model=tiny", "data=sample", "action=eval", f"checkpoint={tmp_path / 'train'}"],
                         "remembered")
    assert remembered["status"] == "ok" and remembered["metrics"] == pytest.approx(res["metrics"])
    wrong = run_job(["task=mrc", "model=tiny", "data=sample", "task.decode=token", "action=eval",
                     f"checkpoint={tmp_path / 'train'}"], "wrong")
    assert wrong["status"] == "failed" and "'span (units=char)' head" in wrong["error"]


@pytest.mark.slow
@pytest.mark.parametrize("vocab", ["kcbert-base", "koelectra"])
def test_ceilings_on_korquad_dev(run_job, vocab):
    """Real vocabularies on the first 600 questions of KorQuAD 1.0 dev (the full-file numbers
    are in the README): character decoding reaches 100 on every answer inside the windows; token
    decoding loses exactly the answers with an edge inside a token."""
    dev = shared_path("data/korquad/KorQuAD_v1.0_dev.json")
    model = ["model=kcbert", f"model.name_or_path={shared_path('vocab/' + vocab)}", "model.init=random"]
    if vocab == "koelectra":
        model[0] = "model=koelectra"
        model.append("model.architecture=electra")
    reports = {}
    for decode in ("token", "char"):
        res = run_job(["task=korquad", "action=ceiling", *model, f"data.validation_file={dev}",
                       "data.max_eval_samples=600", f"task.decode={decode}"], decode)
        assert res["status"] == "ok", res.get("error")
        reports[decode] = res
    token, char = reports["token"]["ceiling"], reports["char"]["ceiling"]
    assert token["answers_lost_to_windows"] == char["answers_lost_to_windows"] == 0
    assert char["metrics_in_windows"] == {"exact_match": 100.0, "f1": 100.0}
    assert char["exact_string_in_windows"] == char["answers_in_windows"]
    assert token["exact_string_in_windows"] == token["answers_in_windows"] - token["answers_with_edge_inside_token"]
    assert token["answers_with_edge_inside_token"] > 0
    assert reports["token"]["metrics"]["exact_match"] < reports["char"]["metrics"]["exact_match"]


@pytest.mark.slow
def test_random_real_vocab_model_trains_and_reports_official_scores(run_job, tmp_path):
    """A seeded split of KorQuAD 1.0 dev, a 1-layer random encoder on KcBERT's vocabulary, token
    decoding through Trainer; the scores in results.json equal the official algorithm on the
    predictions.json the run wrote."""
    dev = shared_path("data/korquad/KorQuAD_v1.0_dev.json")
    res = run_job(["task=korquad", "model=kcbert", f"model.name_or_path={shared_path('vocab/kcbert-base')}",
                   "model.init=random", "model.config_overrides.num_hidden_layers=1",
                   "model.config_overrides.hidden_size=64", "model.config_overrides.num_attention_heads=2",
                   "model.config_overrides.intermediate_size=128", f"data.train_file={dev}",
                   "data.validation_split=0.2", "data.max_train_samples=48", "data.max_eval_samples=40",
                   "train.max_steps=4", "train.batch_size=8", "task.max_length=256"])
    assert res["status"] == "ok", res.get("error")
    assert res["max_length"] == 256 and res["data"]["validation"]["part"] == "held-out"
    predictions = json.loads((tmp_path / "job" / "predictions.json").read_text(encoding="utf-8"))
    assert len(predictions) == res["n_eval"] == 40
    golds = official_golds(json.loads(dev.read_text(encoding="utf-8")))
    expected = official()._official_evaluate({q: golds[q] for q in predictions}, predictions)
    assert res["metrics"]["exact_match"] == pytest.approx(expected["exact_match"], abs=1e-6)
    assert res["metrics"]["f1"] == pytest.approx(expected["f1"], abs=1e-6)
