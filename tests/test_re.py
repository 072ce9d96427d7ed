"""KLUE RE: both marker schemes (``task.markers=typed_punct | klue``) encode every entity, on the
samples and on long synthetic sentences; ``klue`` is KLUE-baseline's (special tokens, resized
embeddings, its tokenization fix, [CLS]) and trains, reloads, scores and exports; windows are
token slices; ``action=score`` of a run's own predictions gives its metrics; AUPRC leaves a class
without gold examples out."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import compose
from heads.model.encoder import add_special_tokens, train_wordpiece
from tasks import build_task
from tasks.base import EncodeSettings
from tasks.splits import sample_file
from tasks.re import KLUE_MARKERS, join_after_closing_markers, mark, special_frame
from test_ner import wordpiece

OPENING = {"typed_punct": {"subject": "@", "object": "#"},
           "klue": {"subject": "<subj>", "object": "<obj>"}}
KLUE_RUN = ["task=re", "model=tiny", "data=sample", "task.markers=klue", "task.pooling=cls", "train.max_steps=3"]


def re_task(*overrides: str):
    return build_task(compose(["task=re", *overrides]).task)


def example(sentence: str, subject: str, obj: str, s_type: str = "PER", o_type: str = "LOC") -> dict:
    s0, o0 = sentence.index(subject), sentence.index(obj)
    return {"id": "g", "sentence": sentence, "span_mismatch": False, "label": "no_relation",
            "subject": {"word": subject, "start": s0, "end": s0 + len(subject) - 1, "type": s_type},
            "object": {"word": obj, "start": o0, "end": o0 + len(obj) - 1, "type": o_type}}


def tokenizer_for(task, examples):
    """The tiny preset's tokenizer (WordPiece trained on the marked text), with the task's tokens."""
    tok = train_wordpiece(task.training_texts(examples), 8000, None)
    add_special_tokens(tok, None, task.special_tokens)
    return tok


def long_sentences() -> list[dict]:
    """Entities at the start, in the middle, at the end and far apart, in sentences of 300+ tokens."""
    filler = "그리고 사람들은 오래된 도시에서 조용히 살았다. " * 25
    return [example("이순신은 한산도에서 싸웠다. " + filler, "이순신", "한산도"),
            example(filler + "김태민의 아내는 이수아이다. " + filler, "김태민", "이수아"),
            example(filler + "세종은 한양에서 태어났다.", "세종", "한양"),
            example(filler + "서울의 " + "그리고 조용히 살았다. " * 3 + "허준이 살았다. " + filler, "허준", "서울")]


def check_every_marker(features, tok, task, max_length: int) -> None:
    for ids, subj, obj in zip(features["input_ids"], features["subject_start"], features["object_start"]):
        tokens = tok.convert_ids_to_tokens(ids)
        assert len(ids) <= max_length
        assert tokens[subj] == OPENING[task.markers]["subject"] and tokens[obj] == OPENING[task.markers]["object"]
        if task.markers == "klue":  # each marker once, as one token: none lost or split
            assert all(tokens.count(m) == 1 for pair in KLUE_MARKERS.values() for m in pair)
        else:  # @ … @ and # … #, and the type names between
            assert tokens.count("@") == tokens.count("#") == 2 and tokens.count("*") == tokens.count("^") == 2


# ---- encoding ------------------------------------------------------------------------------
def test_klue_markers_are_klue_baselines():
    text, spans = mark("이수아의 남편은 김태민이다.", {"start": 0, "end": 2, "type": "PER"},
                       {"start": 9, "end": 11, "type": "PER"}, "klue")
    assert text == "<subj>이수아</subj>의 남편은 <obj>김태민</obj>이다."
    assert {r: text[a:b] for r, (a, b) in spans.items()} == {"subject": "<subj>이수아</subj>",
                                                            "object": "<obj>김태민</obj>"}
    assert re_task("task.markers=klue").special_tokens == ("<subj>", "</subj>", "<obj>", "</obj>")
    assert re_task().special_tokens == ()


def test_klue_tokenization_fix_joins_the_particle_after_a_closing_marker():
    # KLUE-baseline's own example (fix_tokenization_error's docstring)
    text = "<obj>조지 해리슨</obj>이 쓰고 <subj>비틀즈</subj>가"
    tokens = ["<obj>", "조지", "해리", "##슨", "</obj>", "이", "쓰", "##고", "<subj>", "비틀즈", "</subj>", "가"]
    offsets = [(0, 5), (5, 7), (8, 10), (10, 11), (11, 17), (17, 18), (19, 20), (20, 21), (22, 28), (28, 31),
               (31, 38), (38, 39)]
    fixed = join_after_closing_markers(tokens, offsets, text, [17, 38])
    assert fixed == ["<obj>", "조지", "해리", "##슨", "</obj>", "##이", "쓰", "##고", "<subj>", "비틀즈", "</subj>", "##가"]
    # a space after the marker, or a non-Hangul token: unchanged
    assert join_after_closing_markers(["<subj>", "a", "</subj>", "b"], [(0, 6), (6, 7), (7, 14), (14, 15)],
                                      "<subj>a</subj>b", [14]) == ["<subj>", "a", "</subj>", "b"]


def test_klue_encoding_adds_tokens_applies_the_fix_and_reads_cls():
    t = re_task("task.markers=klue", "task.pooling=cls")
    assert t.head == "sequence"
    tok = wordpiece(["조지", "해리", "##슨", "이", "##이", "쓰", "##고", "비틀즈", "가", "##가"])
    before = len(tok)
    assert add_special_tokens(tok, None, t.special_tokens) == 4 and len(tok) == before + 4
    ex = example("조지 해리슨이 쓰고 비틀즈가", "비틀즈", "조지 해리슨")
    features = t.encode([ex], tok, EncodeSettings(max_length=64, token_type_ids=True))
    tokens = tok.convert_ids_to_tokens(features["input_ids"][0])
    assert tokens == ["[CLS]", "<obj>", "조지", "해리", "##슨", "</obj>", "##이", "쓰", "##고",
                      "<subj>", "비틀즈", "</subj>", "##가", "[SEP]"]
    assert features["token_type_ids"][0] == [0] * len(tokens) and features["attention_mask"][0] == [1] * len(tokens)
    assert "subject_start" not in t.model_columns(features)  # [CLS]: the sequence head


def test_klue_markers_need_the_tokens_in_the_tokenizer():
    from kotune.core.errors import ConfigError

    t = re_task("task.markers=klue")
    with pytest.raises(ConfigError, match="lacks <subj>"):
        t.encode([example("세종은 한양에서 태어났다.", "세종", "한양")], wordpiece(["세종"]), EncodeSettings(64))


def test_a_frozen_encoder_warns_that_added_markers_keep_random_embeddings(tmp_path, caplog):
    from kotune.loading.build import load_encoder_side

    texts = ["<subj>세종</subj>은 <obj>한양</obj>에서 태어났다."] * 4
    for mode, warned in (("frozen", True), ("finetune", False)):
        cfg = compose([*KLUE_RUN, f"mode={mode}", f"cache_dir={tmp_path}"])
        caplog.clear()
        with caplog.at_level("WARNING", logger="kotune"):
            load_encoder_side(cfg, build_task(cfg.task), texts)
        said = "mode=frozen: the 4 token(s) task re adds (<subj>, </subj>, <obj>, </obj>) keep random"
        assert (said in caplog.text) == warned, caplog.text


def test_special_tokens_resize_the_embeddings():
    from transformers import BertConfig, BertModel

    tok = wordpiece(["세종", "한양"])
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64))
    old = encoder.get_input_embeddings().weight.detach().clone()
    assert add_special_tokens(tok, encoder, ("<subj>", "</subj>", "<obj>", "</obj>")) == 4
    new = encoder.get_input_embeddings().weight.detach()
    assert new.shape == (len(tok), 64) == (old.shape[0] + 4, 64) and encoder.config.vocab_size == len(tok)
    assert torch.equal(new[:len(old)], old)
    # normal(0, initializer_range=0.02), as transformers 3.5.1 (256 draws: sd of their sd ≈ 0.0009); transformers
    # 5's default, the old rows' mean and covariance, gives 0.0068 here
    assert float(new[len(old):].std()) == pytest.approx(0.02, abs=0.003)
    assert tok.tokenize("<subj>세종</subj>") == ["<subj>", "세종", "</subj>"]


@pytest.mark.parametrize("markers", ["typed_punct", "klue"])
def test_both_schemes_encode_every_entity_on_the_samples(markers):
    t = re_task(f"task.markers={markers}")
    cfg = compose(["task=re"]).task
    examples = [ex for split in ("train", "dev") for ex in t.read_file(sample_file(cfg, split))]
    tok = tokenizer_for(t, examples)
    for max_length in (256, 24):  # the recipe's, and short enough that most sentences are cut
        check_every_marker(t.encode(examples, tok, EncodeSettings(max_length, token_type_ids=False)), tok, t,
                           max_length)


@pytest.mark.parametrize("markers", ["typed_punct", "klue"])
def test_both_schemes_encode_every_entity_in_long_sentences(markers, capsys):
    t = re_task(f"task.markers={markers}")
    examples = long_sentences()
    tok = tokenizer_for(t, examples)
    for max_length in (48, 64, 128):
        check_every_marker(t.encode(examples, tok, EncodeSettings(max_length)), tok, t, max_length)
    assert "fell outside" not in capsys.readouterr().out


def test_windows_are_slices_of_the_sentences_tokens():
    """Bug: a window was cut from the text at token offsets, possibly inside a word (a ##
    continuation), and re-tokenized: its first word then read differently (or as [UNK])."""
    t = re_task()
    filler = "사람들의 " * 40  # 사람 ##들 ##의: most cuts land inside a word
    examples = [example(filler + "이순신은 한산도에서 싸웠다. " + filler, "이순신", "한산도")]
    tok = wordpiece(["사람", "##들", "##의", "이순신", "##은", "한산도", "##에서", "싸웠다", ".", "@", "#", "*", "^",
                     "PER", "LOC"])
    full = tok(t.training_texts(examples).__next__(), add_special_tokens=False)["input_ids"]
    before, after = special_frame(tok)
    for max_length in range(20, 30):
        ids = t.encode(examples, tok, EncodeSettings(max_length))["input_ids"][0]
        window = ids[len(before):len(ids) - len(after)]
        assert len(ids) == max_length
        assert any(full[a:a + len(window)] == window for a in range(len(full))), max_length


# ---- a klue run: train, reload, score, export ------------------------------------------------
def test_klue_markers_train_reload_score_and_export(run_job, tmp_path):
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel

    res = run_job(KLUE_RUN, "train")
    assert res["status"] == "ok", res.get("error")
    model_dir = tmp_path / "train" / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert all(len(tok.tokenize(m)) == 1 for pair in KLUE_MARKERS.values() for m in pair)
    model = KotuneModel.load(str(model_dir))
    assert model.encoder.get_input_embeddings().num_embeddings == len(tok)
    assert model.meta["task_options"] == {"pooling": "cls", "markers": "klue"}

    ckpt = f"checkpoint={tmp_path / 'train'}"
    again = run_job([*KLUE_RUN[:-1], "action=eval", ckpt], "eval")
    assert again["status"] == "ok" and again["metrics"] == pytest.approx(res["metrics"])
    # task.markers not given: the checkpoint's scheme applies; another scheme given: one line naming it
    remembered = run_job(["task=re", "model=tiny", "data=sample", "task.pooling=cls", "action=eval", ckpt], "remembered")
    assert remembered["status"] == "ok" and remembered["metrics"] == pytest.approx(res["metrics"])
    assert remembered["config"]["task"]["markers"] == "klue"
    other = run_job(["task=re", "model=tiny", "data=sample", "task.pooling=cls", "task.markers=typed_punct",
                     "action=eval", ckpt], "other")
    assert other["status"] == "failed" and "task.markers=klue" in other["error"]

    # the run's own predictions.jsonl scores to the run's metrics, AUPRC included
    dev = sample_file(compose(["task=re"]).task, "dev")
    scored = run_job(["task=re", "action=score", "data=sample", f"data.validation_file={dev}",
                      f"score.predictions={res['predictions_file']}"], "score")
    assert scored["status"] == "ok", scored.get("error")
    assert scored["metrics"] == res["metrics"] and set(scored["metrics"]) == {"micro_f1", "auprc"}

    out = run_job([*KLUE_RUN[:-1], "action=export", ckpt, f"export.dir={tmp_path / 'hf'}"], "export")
    assert out["status"] == "ok", out.get("error")
    assert out["native_class"] == "BertForSequenceClassification" and out["pipeline"] == "text-classification"
    assert "<subj>" in out["input_note"] and "never plain text" in out["input_note"]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["kotune_input"] == out["input_note"]
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert exported.tokenize("<subj>세종</subj>")[0] == "<subj>" and len(exported) == len(tok)


def test_typed_punct_cls_export_says_its_input_is_marked(tmp_path):
    from tasks.re import RelationTask

    note = RelationTask.export_note({"pooling": "cls", "markers": "typed_punct"})
    assert "'@ * PER * 이순신 @은 # ^ LOC ^ 한산도 #에서 싸웠다.'" in note and "fix" not in note


# ---- scoring ---------------------------------------------------------------------------------
def test_score_plain_labels_gives_micro_f1_and_says_auprc_needs_probabilities(run_job, tmp_path, capsys):
    """Bug: plain string labels (no probabilities) raised a TypeError."""
    cfg = compose(["task=re"]).task
    dev = sample_file(cfg, "dev")
    gold = re_task().read_file(dev)
    path = tmp_path / "system.jsonl"
    path.write_text("".join(json.dumps({"id": ex["id"], "prediction": ex["label"]}, ensure_ascii=False) + "\n"
                            for ex in gold), encoding="utf-8")
    res = run_job(["task=re", "action=score", "data=sample", f"data.validation_file={dev}",
                   f"score.predictions={path}"], "score")
    assert res["status"] == "ok", res.get("error")
    assert res["metrics"] == {"micro_f1": 100.0}
    assert "AUPRC needs probabilities" in capsys.readouterr().out


def test_score_rejects_incomplete_probabilities(run_job, tmp_path):
    dev = sample_file(compose(["task=re"]).task, "dev")
    gold = re_task().read_file(dev)
    path = tmp_path / "system.jsonl"
    path.write_text("".join(json.dumps({"id": ex["id"], "prediction": ex["label"],
                                        "probabilities": {ex["label"]: 1.0}}, ensure_ascii=False) + "\n"
                            for ex in gold), encoding="utf-8")
    res = run_job(["task=re", "action=score", "data=sample", f"data.validation_file={dev}",
                   f"score.predictions={path}"], "score")
    assert res["status"] == "failed" and "must map each of the 30 relations" in res["error"]


def test_auprc_warns_once_about_relations_without_gold_examples(capsys):
    t = re_task()
    golds = [{"label": "no_relation"}, {"label": "per:spouse"}]
    uniform = [1 / len(t.labels)] * len(t.labels)
    scores = t.score([{"label": "no_relation", "probs": uniform}] * 2, golds)
    lines = [line for line in capsys.readouterr().out.splitlines() if "AUPRC" in line]
    assert len(lines) == 1 and "28 of 30 relations have no gold example" in lines[0]
    # all scores tied: one point (recall 1, precision 1/2) then (0, 1): an area of 3/4 per defined class
    assert scores["auprc"] == pytest.approx(75.0)
