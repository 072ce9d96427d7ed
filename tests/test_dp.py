"""KLUE DP parser options (issue 23): word states from first | mean | first_last subwords, POS
tag features, KLUE-baseline's word LSTM and init (task=dp_klue); scoring a DP run's own predictions
(action=score) and predicting files without HEAD/DEPREL (issue 22 items 3 and 5)."""
from __future__ import annotations

import copy
import json
import math
from collections import Counter

import pytest
import torch

from conftest import compose, shared_path
from tasks import build_task
from tasks.base import EncodeSettings
from tasks.splits import load_splits
from tasks.collate import IGNORE
from tasks.dp import POS_TAGS, UNKNOWN_POS, fallback_heads, pos_id
from kotune.core.errors import ConfigError, DataError
from test_ner import wordpiece
from test_re_dp import DP_DEV, DP_METRICS, dp_example, task

TOKEN_WORD = torch.tensor([[IGNORE, 0, 0, 1, 2, 2, 2, IGNORE], [IGNORE, 0, 1, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]])
GOLD_HEADS = torch.tensor([[2, 0, 2], [0, 1, IGNORE]])
GOLD_DEPRELS = torch.tensor([[1, 2, 3], [4, 0, IGNORE]])
POS_IDS = torch.tensor([[3, 17, UNKNOWN_POS], [2, IGNORE, IGNORE]])
KLUE_HEAD = {"word_pooling": "first_last", "num_pos": len(POS_TAGS) + 2, "pos_dim": 6, "lstm_size": 10,
             "init": "xavier"}


def dependency_head(**options):
    from heads.dependency import DependencyHead

    torch.manual_seed(0)
    return DependencyHead(16, num_labels=5, arc_dim=8, label_dim=4, **options)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- word states -------------------------------------------------------------------------------
def test_first_last_concatenates_a_words_first_and_last_subword_and_doubles_the_root():
    head = dependency_head(word_pooling="first_last")
    hidden = torch.arange(2 * 8 * 16, dtype=torch.float).view(2, 8, 16)
    nodes, exists = head.word_states(hidden, TOKEN_WORD)
    assert nodes.shape == (2, 9, 32)  # root + as many word slots as tokens
    assert torch.equal(nodes[0, 0], torch.cat([hidden[0, 0], hidden[0, 0]]))  # root: [CLS] twice
    assert torch.equal(nodes[0, 1], torch.cat([hidden[0, 1], hidden[0, 2]]))  # word 0: tokens 1 and 2
    assert torch.equal(nodes[0, 2], torch.cat([hidden[0, 3], hidden[0, 3]]))  # one subword: first = last
    assert torch.equal(nodes[0, 3], torch.cat([hidden[0, 4], hidden[0, 6]]))
    assert exists[1].tolist() == [True, True, True] + [False] * 6
    assert exists[0].tolist() == [True] * 4 + [False] * 5
    first = dependency_head(word_pooling="first").word_states(hidden, TOKEN_WORD)[0]
    assert torch.equal(first[0, 3], hidden[0, 4])


# ---- POS features ------------------------------------------------------------------------------
def test_pos_id_is_the_last_morphemes_tag_and_unknown_or_missing_tags_get_their_own_id():
    assert pos_id("NNG+JKS") == POS_TAGS.index("JKS")  # KLUE-baseline: pos.split("+")[-1]
    assert pos_id("VV+EP+EF+SF") == POS_TAGS.index("SF")
    assert pos_id("NNG") == POS_TAGS.index("NNG")
    assert pos_id("NNG+XYZ") == pos_id("_") == pos_id("") == pos_id(None) == UNKNOWN_POS


def test_pos_ids_are_encoded_per_word_only_with_task_pos():
    tok = wordpiece(["철수", "##가", "책", "##을", "읽", "##었다", "."])
    ex = dict(dp_example(["철수가", "책을", "읽었다."], [3, 3, 0], ["NP_SBJ", "NP_OBJ", "VP"]),
              pos=["NNP+JKS", "NNG+WHAT", "_"])
    settings = EncodeSettings(max_length=64, token_type_ids=False)
    with_pos = task("dp", "task.pos=true")
    features = with_pos.encode([ex], tok, settings)
    assert features["pos_ids"][0] == [POS_TAGS.index("JKS"), UNKNOWN_POS, UNKNOWN_POS]
    assert "pos_ids" in with_pos.model_columns(features)
    without = task("dp").encode([ex], tok, settings)
    assert "pos_ids" not in without.column_names


def test_a_file_without_pos_works_with_pos_false_and_is_a_one_line_error_with_pos_true(tmp_path):
    no_tags = write(tmp_path, "no_pos.tsv", "## s1\t가 나\n1\t가\t가\t_\t2\tNP\n2\t나\t나\t_\t0\tVP\n")
    assert task("dp").read_file(no_tags)[0]["words"] == ["가", "나"]
    with pytest.raises(DataError, match=r"no_pos.tsv: the POS column is empty .* set task.pos=false"):
        task("dp", "task.pos=true").read_file(no_tags)
    words = write(tmp_path, "words.tsv", "1\t가\n2\t나\n")
    assert task("dp").read_file(words, labelled=False)[0]["words"] == ["가", "나"]
    with pytest.raises(DataError, match=r"words.tsv:1: no POS column \(column 4 of INDEX WORD_FORM"):
        task("dp", "task.pos=true").read_file(words, labelled=False)


@pytest.mark.parametrize("option", ["task.word_pooling=last", "task.biaffine_init=normal", "task.pos_dim=0",
                                    "task.lstm_size=0"])
def test_bad_dp_options_are_one_line_errors(option):
    with pytest.raises(ConfigError, match=option.split("=")[0]):
        task("dp", option)


# ---- the head with KLUE-baseline's options -----------------------------------------------------
@pytest.mark.parametrize("options", [{"word_pooling": "first_last"},
                                     {"word_pooling": "mean", "num_pos": 47, "pos_dim": 6, "init": "xavier"},
                                     KLUE_HEAD], ids=["first_last", "mean+pos+xavier", "klue"])
def test_dependency_head_options_shapes_loss_and_gradients(options):
    head = dependency_head(**options)
    hidden = torch.randn(2, 8, 16, requires_grad=True)
    arc, labels = head(hidden, None, TOKEN_WORD, pos_ids=POS_IDS)
    assert arc.shape == (2, 8, 9) and labels.shape == (2, 8, 9, 5)  # a word slot per token
    assert arc[1, 0, 1] < -1e30 and arc[1, 0, 3] < -1e30  # self arc, and a word that does not exist
    assert (arc[:, :, 4:] < -1e30).all()  # no candidate past the batch's words
    head.loss((arc, labels), GOLD_HEADS, GOLD_DEPRELS).backward()
    assert head.arc_weight.grad.abs().sum() > 0 and head.label_weight.grad.abs().sum() > 0
    if options.get("init") == "xavier":  # zero biaffine weights pass no gradient below them at step 0
        assert hidden.grad.abs().sum() > 0
    if head.pos_embedding is not None:
        assert head.pos_embedding.weight.grad.abs().sum() > 0
    if head.lstm is not None:
        assert head.lstm.encoder.weight_ih_l0.grad.abs().sum() > 0
        assert head.lstm.decoder.weight_hh_l0.grad.abs().sum() > 0
    head.eval()
    pred_heads, pred_labels = head(hidden, None, TOKEN_WORD, pos_ids=POS_IDS)
    assert pred_heads.shape == (2, 8) and pred_labels.shape == (2, 8)
    assert (pred_heads[:, :3] != torch.arange(1, 4)).all()


def test_lstm_states_of_a_sentence_do_not_depend_on_the_padding_of_its_batch():
    head = dependency_head(**KLUE_HEAD).eval()
    hidden = torch.randn(2, 8, 16)
    alone = head(hidden[1:, :3], None, TOKEN_WORD[1:, :3], pos_ids=POS_IDS[1:, :2])
    batched = head(hidden, None, TOKEN_WORD, pos_ids=POS_IDS)
    assert torch.equal(alone[0][0, :2], batched[0][1, :2]) and torch.equal(alone[1][0, :2], batched[1][1, :2])


def test_a_word_numbered_past_the_token_count_has_no_state_and_is_warned_of(capsys):
    """The head's word axis is the token axis: a sentence whose words without a subword (here
    zero-width spaces, which the normalizer drops) push a word's number past its 4 tokens loses
    that word's state, with the fallback guess and a warning, as any word without a state."""
    words = ["가", "\u200b", "\u200b", "\u200b", "\u200b", "나"]
    ex = dp_example(words, [0, 1, 1, 1, 1, 1], ["NP"] * 6)
    features = task("dp").encode([ex], wordpiece(["가", "나"]), EncodeSettings(max_length=64, token_type_ids=False))
    assert features["token_word"][0] == [IGNORE, 0, IGNORE, IGNORE]  # 나 is word 5, past the 4 tokens
    assert features["represented"][0] == [True] + [False] * 5 and features["heads"][0] == [0]
    assert "word 6 '나' is numbered past the token count" in capsys.readouterr().out


def words_wide(head):
    """``head`` as it was before its word axis followed the tokens: as wide as the batch's words, a
    width read from the word numbers (a host read, a wait on the device every step)."""
    reference = copy.deepcopy(head)
    reference.word_states = lambda hidden, token_word: reference._word_states(
        hidden, token_word, int(token_word.max().clamp(min=-1)) + 1)
    return reference


@pytest.mark.parametrize("options", [{}, {"word_pooling": "first_last"},
                                     {"word_pooling": "mean", "num_pos": 47, "pos_dim": 6, "init": "xavier"},
                                     KLUE_HEAD], ids=["first", "first_last", "mean+pos+xavier", "klue"])
def test_the_token_wide_word_axis_gives_the_loss_gradients_and_predictions_of_the_word_wide_one(options):
    """The slots past the batch's words change nothing: the same arc and label scores where the words
    are, the same loss and gradients (gold rows as the collator pads them, maybe wider than the
    words) and the same predicted words. Dropout is off: its draws depend on the tensors' shapes."""
    head = dependency_head(**options)
    for module in head.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
    reference = words_wide(head)
    torch.manual_seed(1)
    hidden = torch.randn(2, 8, 16)
    for width in (3, 5):  # the gold rows: as wide as the words, or padded past them
        gold = [torch.nn.functional.pad(g, (0, width - 3), value=IGNORE) for g in (GOLD_HEADS, GOLD_DEPRELS)]
        results = []
        for model in (head.train(), reference.train()):
            states = hidden.clone().requires_grad_()
            scores = model(states, None, TOKEN_WORD, pos_ids=POS_IDS)
            loss = model.loss(scores, *gold)
            loss.backward()
            results.append((scores, loss, states.grad))
        (wide, wide_loss, wide_grad), (narrow, narrow_loss, narrow_grad) = results
        assert narrow[0].shape == (2, 3, 4) and wide[0].shape == (2, 8, 9)
        for got, expected in ((wide[0][:, :3, :4], narrow[0]), (wide[1][:, :3, :4], narrow[1]),
                              (wide_loss, narrow_loss), (wide_grad, narrow_grad)):
            same(got, expected)
        with torch.no_grad():
            wide, narrow = (model.eval()(hidden, None, TOKEN_WORD, pos_ids=POS_IDS) for model in (head, reference))
        assert torch.equal(wide[0][:, :3], narrow[0]) and torch.equal(wide[1][:, :3], narrow[1])
        assert torch.equal(head.loss(wide, *gold), reference.loss(narrow, *gold))


def same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float32 rounding: a matrix product over more rows may sum in another order (the
    CPU's BLAS picks its blocking by shape; measured: at most 1.2e-7 apart here, often bit-equal)."""
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_xavier_init_follows_klue_baseline_and_zero_init_starts_at_zero():
    head = dependency_head(init="xavier")
    bound = math.sqrt(6 / (8 * 8 + 8))  # BiAttention.U: [1, arc, arc] → fan_in arc², fan_out arc
    assert 0 < head.arc_weight.abs().max() <= bound and head.arc_weight.std() > bound / 4
    assert head.label_weight[:, :4, :4].abs().sum() > 0 and head.label_weight[:, 4, :4].abs().sum() > 0
    assert not head.label_weight.detach()[:, 4, 4].any()  # BiLinear.bias starts at 0
    zero = dependency_head()
    assert not zero.arc_weight.detach().any() and not zero.label_weight.detach().any()


def test_a_pos_head_without_pos_ids_says_so():
    with pytest.raises(ValueError, match="no pos_ids"):
        dependency_head(**KLUE_HEAD)(torch.randn(2, 8, 16), None, TOKEN_WORD)


def test_dp_klue_preset_is_klue_baselines_parser_and_dp_yaml_names_it_as_the_reference():
    cfg = compose(["task=dp_klue"]).task
    reference = dict(cfg.reference.task)
    assert {k: cfg[k] for k in reference} == reference
    assert reference["word_pooling"] == "first_last" and reference["pos"] and reference["lstm"]
    assert dict(compose(["task=dp"]).task.reference.task) == reference
    assert not compose(["task=dp"]).task.pos  # the light parser stays the default


def test_the_klue_head_is_refused_by_export_in_one_line(tmp_path):
    from kotune.export.native import export_directory
    from test_export import tiny_model

    model = tiny_model("dependency", {"num_labels": 5, **KLUE_HEAD})
    model.save(str(tmp_path / "m"))
    with pytest.raises(ConfigError, match=r"^cannot export .*: the dependency head has no native transformers class$"):
        export_directory(str(tmp_path / "m"), str(tmp_path / "hf"))


# ---- runs: score its own predictions, predict unlabelled files, reload --------------------------
def test_dp_klue_run_scores_its_own_predictions_and_predicts_unlabelled_files(run_job, tmp_path):
    trained = run_job(["task=dp_klue", "model=tiny", "data=sample", "train.max_steps=3"], name="train")
    assert trained["status"] == "ok", trained.get("error")
    run_dir = tmp_path / "train"
    scored = run_job(["task=dp_klue", "action=score", "data=sample",
                      f"score.predictions={run_dir / 'predictions.jsonl'}"], name="score")
    assert scored["status"] == "ok", scored.get("error")
    assert scored["metrics"] == trained["metrics"] and set(scored["metrics"]) == DP_METRICS | {"n_words_excluded"}
    # four columns (no HEAD, DEPREL), POS read
    unlabelled = write(tmp_path, "unlabelled.tsv", "## s1\t철수가 책을 읽었다.\n1\t철수가\t철수 가\tNNP+JKS\n"
                                                   "2\t책을\t책 을\tNNG+JKO\n3\t읽었다.\t읽 었 다 .\tVV+EP+EF+SF\n")
    predicted = run_job(["task=dp_klue", "action=predict", f"checkpoint={run_dir}", f"data.predict_file={unlabelled}"],
                        name="predict")
    assert predicted["status"] == "ok", predicted.get("error")
    rows = [json.loads(line) for line in open(predicted["predictions_file"], encoding="utf-8")]
    assert [r["id"] for r in rows] == ["s1"] and len(rows[0]["heads"]) == len(rows[0]["deprels"]) == 3
    assert rows[0]["gold_heads"] is None
    # a words-only file to a model that reads POS: one line naming the file and row
    words = write(tmp_path, "words.tsv", "철수가\n책을\n읽었다.\n")
    failed = run_job(["task=dp_klue", "action=predict", f"checkpoint={run_dir}", f"data.predict_file={words}"],
                     name="predict_words")
    assert failed["status"] == "failed" and "words.tsv:1: no POS column" in failed["error"]
    # the checkpoint's POS option cannot be switched off
    other = run_job(["task=dp_klue", "task.pos=false", "action=eval", f"checkpoint={run_dir}", "data=sample"],
                    name="eval_no_pos")
    assert other["status"] == "failed" and "was trained with task.pos=True" in other["error"]


def test_a_model_without_pos_predicts_a_file_of_bare_words(run_job, tmp_path):
    trained = run_job(["task=dp", "model=tiny", "data=sample", "train.max_steps=2"], name="train")
    assert trained["status"] == "ok", trained.get("error")
    words = write(tmp_path, "words.txt", "철수가\n책을\n읽었다.\n\n영희가\n웃었다.\n")
    predicted = run_job(["task=dp", "action=predict", f"checkpoint={tmp_path / 'train'}",
                         f"data.predict_file={words}"], name="predict")
    assert predicted["status"] == "ok", predicted.get("error")
    rows = [json.loads(line) for line in open(predicted["predictions_file"], encoding="utf-8")]
    assert [r["words"] for r in rows] == [["철수가", "책을", "읽었다."], ["영희가", "웃었다."]]
    assert all(len(r["heads"]) == len(r["words"]) for r in rows)


def test_bad_unlabelled_rows_are_still_one_line_errors(tmp_path):
    seven = write(tmp_path, "seven.tsv", "1\t가\t가\tNNG\t0\tVP\textra\n")
    with pytest.raises(DataError, match=r"seven.tsv:1: 7 tab-separated columns, expected at most 6"):
        task("dp").read_file(seven, labelled=False)
    gap = write(tmp_path, "gap.tsv", "1\t가\n3\t나\n")
    with pytest.raises(DataError, match=r"gap.tsv:2: word index '3', expected 2"):
        task("dp").read_file(gap, labelled=False)
    with pytest.raises(DataError, match=r"gap.tsv:1: 2 tab-separated columns, expected 6"):
        task("dp").read_file(gap)  # training and evaluation still need HEAD and DEPREL


def test_dp_klue_leaves_words_cut_by_max_length_out_of_the_scores_as_klue_baseline():
    """KLUE-baseline truncates ``head_ids`` with the tokens: a word past max_length is not scored.
    task=dp scores it with the decode's guess; task=dp_klue leaves it out and counts it."""
    tok = wordpiece(["철수", "##가", "책", "##을", "읽", "##었다", "."])
    ex = dict(dp_example(["철수가", "책을", "읽었다."], [3, 3, 0], ["NP_SBJ", "NP_OBJ", "VP"]),
              pos=["NNP+JKS", "NNG+JKO", "VV+EP+EF+SF"])
    settings = EncodeSettings(max_length=6, token_type_ids=False)  # [CLS] 철수 ##가 책 ##을 [SEP]: word 3 cut
    predicted = {"heads": [3, 3, 0], "deprels": ["NP_SBJ", "NP_OBJ", "NP"], "truncated_words": 1}
    for name in ("dp_klue", "dp"):
        t = task(name)
        features = t.encode([ex], tok, settings)
        # the ceiling: words 1 and 2 have a gold head without a state (the fallback: 2 and 3, one
        # right), word 3 gets the fallback root (right): 2 of 3, or 1 of 2 without the cut word
        ceiling, _ = t.ceiling(features, [ex])
        assert ceiling["uas_micro_f1"] == pytest.approx(200 / 3 if name == "dp" else 50.0)
        assert features["truncated_words"][0] == 1
        assert t.decode(([[1, 1, 0]], [[3, 5, 0]]), features, [ex])[0]["truncated_words"] == 1
        scores = t.score([predicted], [ex])  # words 1 and 2 right; word 3's relation wrong
        if name == "dp":
            assert scores["las_micro_f1"] == pytest.approx(200 / 3) and "n_words_excluded" not in scores
        else:
            assert scores["las_micro_f1"] == 100.0 and scores["n_words_excluded"] == 1
    assert task("dp").score([{**predicted, "truncated_words": 0}], [ex]) == task("dp").score([predicted], [ex])
    with pytest.raises(ConfigError, match="task.truncated_words=drop: choose one of guess, exclude"):
        task("dp", "task.truncated_words=drop")


def test_dp_klue_scores_its_own_truncated_run_as_action_score_does(run_job, tmp_path):
    args = ["model=tiny", "data=sample", "train.max_steps=2", "train.max_length=5", "task.lstm_size=16",
            "task.pos_dim=8"]
    trained = run_job(["task=dp_klue", *args], name="train")
    assert trained["status"] == "ok", trained.get("error")
    rows = [json.loads(line) for line in open(trained["predictions_file"], encoding="utf-8")]
    cut = sum(r["truncated_words"] for r in rows)
    assert cut > 0 and trained["metrics"]["n_words_excluded"] == cut
    predictions = f"score.predictions={tmp_path / 'train' / 'predictions.jsonl'}"
    scored = run_job(["task=dp_klue", "action=score", "data=sample", predictions], name="score")
    assert scored["metrics"] == trained["metrics"]
    every_word = run_job(["task=dp", "action=score", "data=sample", predictions], name="score_dp")
    assert set(every_word["metrics"]) == DP_METRICS and every_word["metrics"] != scored["metrics"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({**r, "truncated_words": -1}) + "\n" for r in rows), encoding="utf-8")
    res = run_job(["task=dp_klue", "action=score", "data=sample", f"score.predictions={bad}"], name="bad")
    assert res["status"] == "failed" and "truncated_words -1 is not a word count" in res["error"]


def test_score_explains_a_dp_prediction_without_relations(run_job, tmp_path):
    gold = task("dp").read_file("tasks/samples/dp/dev.tsv")
    heads_only = tmp_path / "heads.jsonl"
    heads_only.write_text("".join(json.dumps({"id": ex["id"], "prediction": ex["heads"]}) + "\n" for ex in gold))
    res = run_job(["task=dp", "action=score", "data=sample", f"score.predictions={heads_only}"])
    assert res["status"] == "failed" and "a DP prediction needs heads and deprels" in res["error"]
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({"id": ex["id"], "heads": ex["heads"], "deprels": ["NOPE"] * len(ex["heads"])})
                             + "\n" for ex in gold))
    res = run_job(["task=dp", "action=score", "data=sample", f"score.predictions={wrong}"], name="wrong")
    assert res["status"] == "failed" and "1 unknown relation(s): 'NOPE'" in res["error"]


# ---- a short real run ---------------------------------------------------------------------------
def next_word_rule_las_micro(cfg) -> float:
    """The next word as head, the training split's most frequent relation (bench/dp_options.py)."""
    t = build_task(cfg.task)
    splits = load_splits(t, cfg.data, ("train", "validation"), int(cfg.train.seed))
    label = Counter(d for ex in splits["train"].examples for d in ex["deprels"]).most_common(1)[0][0]
    examples = splits["validation"].examples
    outputs = [{"heads": fallback_heads(len(ex["words"])), "deprels": [label] * len(ex["words"])} for ex in examples]
    return t.score(outputs, examples)["las_micro_f1"]


@pytest.mark.slow
def test_dp_klue_short_real_run_beats_the_next_word_rule_on_las(run_job):
    path = shared_path(DP_DEV)
    overrides = ["task=dp_klue", "model=tiny", f"data.train_file={path}", "data.validation_split=0.2",
                 "data.max_train_samples=400", "train.max_steps=40", "train.learning_rate=1e-3"]
    res = run_job(overrides)
    assert res["status"] == "ok", res.get("error")
    baseline = next_word_rule_las_micro(compose(overrides))
    assert res["metrics"]["las_micro_f1"] > baseline + 5, (res["metrics"], baseline)
