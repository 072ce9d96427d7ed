"""Tests for tasks.metrics and tasks.metrics_spans.

Golden values are worked out by hand in the comments; where sklearn / scipy /
seqeval are installed the functions are also cross-checked against them, and
KorQuAD is cross-checked against a transcription of the official
evaluate-v1.0.py (the ``_official_*`` functions below).
"""

from __future__ import annotations

import math
import random
import re
import string
import warnings
from collections import Counter

import pytest

from tasks.metrics import (
    accuracy,
    binary_f1_at,
    klue_dp_scores,
    klue_re_auprc,
    klue_re_micro_f1,
    macro_f1,
    pearson,
)
from tasks.metrics_spans import (
    NER_ENTITY_TAGS,
    klue_mrc_normalize,
    klue_mrc_rouge_w,
    klue_mrc_scores,
    korquad_em,
    korquad_f1,
    korquad_normalize,
    korquad_scores,
    ner_char_f1,
    ner_entity_f1,
)

approx = lambda v: pytest.approx(v, abs=1e-6)  # noqa: E731


# ---------------------------------------------------------------------------
# accuracy / macro F1 / pearson / STS F1
# ---------------------------------------------------------------------------


def test_accuracy():
    # matches at positions 0 and 2 -> 2/4
    assert accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == approx(50.0)
    with pytest.raises(ValueError):
        accuracy([1], [1, 2])


GOLD3 = [0, 0, 0, 1, 1, 2]
PRED3 = [0, 0, 1, 1, 2, 2]


def test_macro_f1_three_classes():
    # class 0: tp=2 fp=0 fn=1 -> F = 4/5
    # class 1: tp=1 fp=1 fn=1 -> F = 2/4 = 1/2
    # class 2: tp=1 fp=1 fn=0 -> F = 2/3
    # macro = (24/30 + 15/30 + 20/30) / 3 = 59/90
    assert macro_f1(PRED3, GOLD3) == approx(100 * 59 / 90)  # 65.5556
    # explicit label 3 never seen: F = 0 (sklearn default) -> (59/30)/4
    assert macro_f1(PRED3, GOLD3, labels=[0, 1, 2, 3]) == approx(100 * 59 / 120)
    # only classes 0 and 2: (4/5 + 2/3) / 2 = 11/15
    assert macro_f1(PRED3, GOLD3, labels=[0, 2]) == approx(100 * 11 / 15)
    # a label only predicted counts: gold [a,a], pred [a,b] -> a: 2/3, b: 0
    assert macro_f1(["a", "b"], ["a", "a"]) == approx(100 * (2 / 3) / 2)


def test_macro_f1_matches_sklearn():
    skm = pytest.importorskip("sklearn.metrics")
    assert macro_f1(PRED3, GOLD3) == approx(100 * skm.f1_score(GOLD3, PRED3, average="macro"))
    rng = random.Random(0)
    for _ in range(20):
        g = [rng.randrange(5) for _ in range(60)]
        p = [rng.randrange(5) if rng.random() < 0.6 else x for x in g]
        ref = 100 * skm.f1_score(g, p, average="macro")
        assert macro_f1(p, g) == approx(ref)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = 100 * skm.f1_score(g, p, labels=[0, 1, 2, 7], average="macro")
        assert macro_f1(p, g, labels=[0, 1, 2, 7]) == approx(ref)


def test_pearson():
    # x=[1,2,3,4] (mean 2.5), y=[2,4,5,9] (mean 5)
    # dx=[-1.5,-.5,.5,1.5], dy=[-3,-1,0,4]; sum dxdy = 4.5+.5+0+6 = 11
    # sxx = 5, syy = 9+1+0+16 = 26 -> r = 11/sqrt(130) = 0.9647638...
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == approx(100 * 11 / math.sqrt(130))
    assert pearson([1, 2, 3], [3, 2, 1]) == approx(-100.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))  # scipy: nan for constant input


def test_pearson_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    x = [rng.uniform(0, 5) for _ in range(100)]
    y = [v + rng.gauss(0, 1) for v in x]
    assert pearson(x, y) == approx(100 * stats.pearsonr(x, y)[0])


def test_sts_binary_f1_threshold_inclusive():
    preds = [3.0, 2.99, 4.5, 1.0, 3.0]
    golds = [3.0, 3.0, 2.0, 0.5, 5.0]
    # pred >= 3 -> [1,0,1,0,1]; gold >= 3 -> [1,1,0,0,1]
    # tp = 2 (idx 0, 4), fp = 1 (idx 2), fn = 1 (idx 1) -> F = 4/6
    assert binary_f1_at(preds, golds) == approx(100 * 4 / 6)
    # no positives anywhere -> 0 (sklearn zero_division default)
    assert binary_f1_at([1.0, 2.0], [0.0, 2.9]) == 0.0
    # custom threshold 2.0: pred [1,1,1,0,1], gold [1,1,1,0,1] -> 1
    assert binary_f1_at(preds, golds, threshold=2.0) == approx(100.0)


def test_sts_binary_f1_matches_sklearn():
    skm = pytest.importorskip("sklearn.metrics")
    rng = random.Random(2)
    g = [round(rng.uniform(0, 5), 1) for _ in range(200)]
    p = [min(5.0, max(0.0, v + rng.choice([-1, -0.5, 0, 0, 0.5]))) for v in g]
    ref = 100 * skm.f1_score([int(v >= 3) for v in g], [int(v >= 3) for v in p], average="binary")
    assert binary_f1_at(p, g) == approx(ref)


# ---------------------------------------------------------------------------
# NER
# ---------------------------------------------------------------------------


def test_ner_entity_strict_vs_lenient():
    gold = [["B-PS", "I-PS", "O", "B-LC"]]
    pred = [["I-PS", "I-PS", "O", "B-LC"]]
    # strict IOB2: the pred PS chunk starts with I- -> not an entity.
    # gold {PS(0,2), LC(3,4)}, pred {LC(3,4)}
    # PS: tp 0 -> F 0; LC: F 1 -> macro 1/2
    # micro: tp 1, |pred| 1, |gold| 2 -> P 1, R 1/2 -> F 2/3
    out = ner_entity_f1(pred, gold)
    assert out["entity_f1"] == approx(50.0)
    assert out["entity_f1_micro"] == approx(100 * 2 / 3)
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    # lenient (default conlleval) mode accepts the I- start: everything matches
    assert seqeval_metrics.f1_score(gold, pred, average="macro") == approx(1.0)


def test_ner_entity_type_change_and_sentences():
    gold = [["B-OG", "I-OG", "I-OG"], ["B-DT", "O"]]
    pred = [["B-OG", "I-OG", "I-PS"], ["B-DT", "O"]]
    # sent 0: gold OG(0,3); pred OG(0,2) (I-PS cannot continue OG nor start) -> OG: 0
    # sent 1: DT(0,1) both -> DT: 1
    # macro over {DT, OG} = 1/2 ; micro: tp 1, pred 2, gold 2 -> 1/2
    out = ner_entity_f1(pred, gold)
    assert out == {"entity_f1": approx(50.0), "entity_f1_micro": approx(50.0)}
    # a type only predicted (QT) enters the macro average with F = 0:
    # {DT: 1, OG: 0, QT: 0} -> 1/3
    pred2 = [["B-OG", "I-OG", "I-PS"], ["B-DT", "B-QT"]]
    assert ner_entity_f1(pred2, gold)["entity_f1"] == approx(100 / 3)


def test_ner_entity_no_entities_is_nan_like_seqeval():
    out = ner_entity_f1([["O", "O"]], [["O", "O"]])
    assert math.isnan(out["entity_f1"]) and out["entity_f1_micro"] == 0.0
    with pytest.raises(ValueError):
        ner_entity_f1([["O"]], [["O", "O"]])
    with pytest.raises(ValueError):
        ner_entity_f1([["X-PS"]], [["O"]])


def test_ner_entity_matches_seqeval_strict():
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    from seqeval.scheme import IOB2

    tags = ["O", "O", "B-PS", "I-PS", "B-LC", "I-LC", "B-DT", "I-DT"]
    rng = random.Random(3)
    for _ in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 4))]
        pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in s] for s in gold]
        out = ner_entity_f1(pred, gold)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_macro = seqeval_metrics.f1_score(gold, pred, average="macro", mode="strict", scheme=IOB2)
            ref_micro = seqeval_metrics.f1_score(gold, pred, average="micro", mode="strict", scheme=IOB2)
        if math.isnan(ref_macro):
            assert math.isnan(out["entity_f1"])
        else:
            assert out["entity_f1"] == approx(100 * ref_macro)
        assert out["entity_f1_micro"] == approx(100 * ref_micro)


# "김 철수": the space is tagged O in gold and B-PS in pred
CHARS = [["김", " ", "철", "수"]]
GOLD_C = [["B-PS", "O", "B-PS", "I-PS"]]
PRED_C = [["B-PS", "B-PS", "B-PS", "O"]]


def test_ner_char_f1_spaces_excluded():
    # kept positions 0,2,3: gold [B-PS,B-PS,I-PS], pred [B-PS,B-PS,O]
    # B-PS: tp 2 -> 1 ; I-PS: fn 1 -> 0 ; O: fp 1 -> 0
    # the other 10 entity tags never occur -> 1 each (zero_division=True)
    # without O: (1 + 0 + 10)/12 ; with O: (1 + 0 + 0 + 10)/13
    assert ner_char_f1(PRED_C, GOLD_C, chars=CHARS) == approx(100 * 11 / 12)
    assert ner_char_f1(PRED_C, GOLD_C, chars=CHARS, include_o=True) == approx(100 * 11 / 13)


def test_ner_char_f1_spaces_included_without_chars():
    # all 4 positions: B-PS tp 2 fp 1 -> 4/5 ; I-PS 0 ; O: fp 1 fn 1 -> 0
    # without O: (0.8 + 0 + 10)/12 = 0.9 ; with O: 10.8/13
    assert ner_char_f1(PRED_C, GOLD_C) == approx(90.0)
    assert ner_char_f1(PRED_C, GOLD_C, include_o=True) == approx(100 * 10.8 / 13)


def test_ner_char_f1_matches_klue_baseline_sklearn_call():
    skm = pytest.importorskip("sklearn.metrics")
    # KLUE-baseline label order (KlueNERProcessor.get_labels)
    label_list = ["B-PS", "I-PS", "B-LC", "I-LC", "B-OG", "I-OG", "B-DT", "I-DT", "B-TI", "I-TI", "B-QT", "I-QT", "O"]
    assert sorted(label_list[:-1]) == sorted(NER_ENTITY_TAGS)
    rng = random.Random(4)
    used = ["O"] * 6 + label_list[:8]  # TI / QT never used -> zero_division path
    gold = [[rng.choice(used) for _ in range(rng.randint(3, 20))] for _ in range(30)]
    pred = [[t if rng.random() < 0.75 else rng.choice(used) for t in s] for s in gold]
    chars = [[" " if rng.random() < 0.15 else "가" for _ in s] for s in gold]
    fg, fp = [], []
    for g, p, c in zip(gold, pred, chars):
        for gt, pt, ch in zip(g, p, c):
            if ch != " ":
                fg.append(label_list.index(gt))
                fp.append(label_list.index(pt))
    ref_with_o = skm.f1_score(fg, fp, labels=list(range(13)), average="macro", zero_division=True)
    ref_no_o = skm.f1_score(fg, fp, labels=list(range(12)), average="macro", zero_division=True)
    assert ner_char_f1(pred, gold, chars=chars, include_o=True) == approx(100 * ref_with_o)
    assert ner_char_f1(pred, gold, chars=chars) == approx(100 * ref_no_o)


# ---------------------------------------------------------------------------
# KorQuAD 1.0
# ---------------------------------------------------------------------------


def test_korquad_normalize():
    assert korquad_normalize("《해리 포터》") == "해리 포터"
    assert korquad_normalize("Hello, World!") == "hello world"
    assert korquad_normalize("서울(한국)") == "서울 한국"  # brackets -> spaces
    assert korquad_normalize("‘이순신’  장군") == "이순신 장군"
    assert korquad_normalize("〈 〉") == ""
    assert korquad_normalize("1,000원.") == "1000원"
    assert korquad_normalize("·중점·") == "·중점·"  # non-ASCII punctuation stays


def test_korquad_em_f1_pairs():
    assert korquad_em("《해리 포터》", "해리 포터") == 1.0
    assert korquad_em("해리포터", "해리 포터") == 0.0
    # F1 ignores spaces: same characters -> 1
    assert korquad_f1("해리포터", "해리 포터") == approx(1.0)
    # pred chars 해리포터와마법사의돌 (10), gold 해리포터 (4), common 4
    # P = .4, R = 1 -> F = .8/1.4 = 4/7
    assert korquad_f1("해리 포터와 마법사의 돌", "해리 포터") == approx(4 / 7)
    # multiset: 가가나 vs 가나나 -> common {가:1, 나:1} = 2 -> P = R = 2/3
    assert korquad_f1("가가나", "가나나") == approx(2 / 3)
    # punctuation only differs
    assert korquad_em("1,000원.", "1000원") == 1.0
    # empty predictions
    assert korquad_em("", "서울") == 0.0 and korquad_f1("", "서울") == 0.0
    assert korquad_em("《》", "서울") == 0.0 and korquad_f1("《》", "서울") == 0.0
    # two empty strings: EM 1 but F1 0 (script returns 0 when nothing is shared)
    assert korquad_em("《》", "()") == 1.0 and korquad_f1("《》", "()") == 0.0


def test_korquad_scores_hand():
    golds = {"q1": ["해리 포터", "해리포터"], "q2": ["1000원"], "q3": ["서울"], "q4": ["부산"]}
    preds = {"q1": "《해리 포터》", "q2": "1,000 원", "q3": "서울특별시"}
    # q1: EM 1, F1 1
    # q2: "1000 원" vs "1000원": EM 0, F1 1 (spaces ignored)
    # q3: EM 0, F1: 5 vs 2 chars, common 2 -> P .4 R 1 -> 4/7
    # q4: missing -> 0, still counted
    # EM = 1/4 ; F1 = (2 + 4/7)/4 = 9/14
    with pytest.warns(UserWarning, match="1 unanswered"):
        out = korquad_scores(preds, golds)
    assert out["exact_match"] == approx(25.0)
    assert out["f1"] == approx(100 * 9 / 14)


# --- transcription of KorQuAD 1.0 evaluate-v1.0.py (reference oracle) -------


def _official_normalize_answer(s):
    def remove_(text):
        text = re.sub("'", " ", text)
        text = re.sub('"', " ", text)
        text = re.sub("《", " ", text)
        text = re.sub("》", " ", text)
        text = re.sub("<", " ", text)
        text = re.sub(">", " ", text)
        text = re.sub("〈", " ", text)
        text = re.sub("〉", " ", text)
        text = re.sub(r"\(", " ", text)
        text = re.sub(r"\)", " ", text)
        text = re.sub("‘", " ", text)
        text = re.sub("’", " ", text)
        return text

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_punc(lower(remove_(s))))


def _official_f1_score(prediction, ground_truth):
    prediction_tokens = _official_normalize_answer(prediction).split()
    ground_truth_tokens = _official_normalize_answer(ground_truth).split()
    prediction_char = []
    for tok in prediction_tokens:
        prediction_char.extend([a for a in tok])
    ground_truth_char = []
    for tok in ground_truth_tokens:
        ground_truth_char.extend([a for a in tok])
    common = Counter(prediction_char) & Counter(ground_truth_char)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_char)
    recall = 1.0 * num_same / len(ground_truth_char)
    return (2 * precision * recall) / (precision + recall)


def _official_exact_match_score(prediction, ground_truth):
    return _official_normalize_answer(prediction) == _official_normalize_answer(ground_truth)


def _official_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def _official_evaluate(golds, predictions):
    """evaluate() with the SQuAD json flattened to {id: [answer texts]}."""
    f1 = exact_match = total = 0
    for qid, ground_truths in golds.items():
        total += 1
        if qid not in predictions:
            continue  # "Unanswered question ... will receive score 0."
        prediction = predictions[qid]
        exact_match += _official_metric_max_over_ground_truths(_official_exact_match_score, prediction, ground_truths)
        f1 += _official_metric_max_over_ground_truths(_official_f1_score, prediction, ground_truths)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


KORQUAD_PAIRS = [
    ("《해리 포터》", ["해리 포터"]),
    ("해리포터", ["해리 포터"]),
    ("해리 포터와 마법사의 돌", ["해리 포터", "마법사의 돌"]),
    ("1,000원.", ["1000원"]),
    ("", ["서울"]),
    ("《》", ["서울"]),
    ("서울(한국)", ["서울 한국", "서울"]),
    ("‘이순신’ 장군", ["이순신"]),
    ("〈동아일보〉", ["동아일보"]),
    ("<b>굵게</b>", ["굵게"]),
    ("\"인용\"", ["인용"]),
    ("'작은따옴표'", ["작은따옴표"]),
    ("BTS", ["bts", "방탄소년단"]),
    ("Hello, World!", ["hello world"]),
    ("3.14", ["314"]),
    ("1998년 3월", ["1998년"]),
    ("가가나", ["가나나"]),
    ("  여러   공백  ", ["여러 공백"]),
    ("세종대왕", ["세종"]),
    ("조선 제4대 왕 세종", ["세종대왕", "세종"]),
    ("·중점·", ["중점"]),
    ("A-B", ["ab", "a b"]),
    ("100%", ["100 %"]),
    ("이승만 정부", ["이승만"]),
    ("무명천", ["실리콘유"]),
    ("「낫표」", ["낫표"]),
    ("ÉCOLE", ["école"]),
    ("1,2,3", ["123"]),
    ("미국 (USA)", ["미국"]),
    ("《()‘’》", ["()"]),
    ("대한민국 임시정부", ["대한민국임시정부", "임시정부"]),
]


def test_korquad_scores_equal_official():
    golds = {f"q{i}": gts for i, (_, gts) in enumerate(KORQUAD_PAIRS)}
    preds = {f"q{i}": p for i, (p, _) in enumerate(KORQUAD_PAIRS)}
    ref = _official_evaluate(golds, preds)
    assert korquad_scores(preds, golds) == {"exact_match": approx(ref["exact_match"]), "f1": approx(ref["f1"])}
    for p, gts in KORQUAD_PAIRS:
        for g in gts:
            assert korquad_normalize(p) == _official_normalize_answer(p)
            assert korquad_em(p, g) == float(_official_exact_match_score(p, g))
            assert korquad_f1(p, g) == approx(_official_f1_score(p, g))
    # with missing predictions
    del preds["q0"], preds["q5"]
    ref = _official_evaluate(golds, preds)
    with pytest.warns(UserWarning):
        out = korquad_scores(preds, golds)
    assert out == {"exact_match": approx(ref["exact_match"]), "f1": approx(ref["f1"])}


# ---------------------------------------------------------------------------
# KLUE-MRC
# ---------------------------------------------------------------------------


def test_klue_mrc_normalize_bracket_quirk():
    # KLUE-baseline's regex r"[\'\"《》<>〈〉]\(\)\‘\’" needs the literal "()‘’"
    # after the bracket, so 《》〈〉‘’ survive; KorQuAD turns them into spaces.
    assert klue_mrc_normalize("《해리 포터》") == "《해리 포터》"
    assert korquad_normalize("《해리 포터》") == "해리 포터"
    assert klue_mrc_normalize("〈동아일보〉 ‘기사’") == "〈동아일보〉 ‘기사’"
    # ( ) are ASCII punctuation: deleted without a space (KorQuAD: a space)
    assert klue_mrc_normalize("서울(한국)") == "서울한국"
    assert korquad_normalize("서울(한국)") == "서울 한국"
    # the one string the regex does match: bracket + literal "()‘’" -> " "
    assert klue_mrc_normalize("a《()‘’b") == "a b"
    assert klue_mrc_normalize("  Seoul,  KOREA!! ") == "seoul korea"


def test_klue_mrc_rouge_w_hand():
    # "해리 포터" (5 chars) vs "《해리 포터》" (7): LCCS "해리 포터" = 5
    # P = 1, R = 5/7 -> F = (10/7)/(12/7) = 5/6
    assert klue_mrc_rouge_w("해리 포터", "《해리 포터》") == approx(5 / 6)
    # contiguous, not LCS: "abxcd" vs "abcd": LCCS 2 ("ab") -> P 2/5, R 2/4
    # F = 2*.4*.5/.9 = 4/9
    assert klue_mrc_rouge_w("abxcd", "abcd") == approx(4 / 9)
    assert klue_mrc_rouge_w("", "서울") == 0.0
    assert klue_mrc_rouge_w("", "") == 1.0 and klue_mrc_rouge_w("서울", "") == 0.0


def test_klue_mrc_scores_hand():
    golds = {
        "q1": ["《해리 포터》"],
        "q2": ["서울", "서울특별시청"],
        "q3": [],
        "q4": ["seoul"],
    }
    preds = {"q1": "해리 포터", "q2": "서울특별시", "q3": "", "q4": "Seoul!"}
    types = {"q1": 1, "q2": 2, "q3": 3, "q4": 1}
    # q1: EM 0 (《》 survive KLUE normalisation), RW 5/6
    # q2: EM 0; vs "서울": LCCS 2, P 2/5 R 1 -> 4/7; vs "서울특별시청": LCCS 5,
    #     P 1 R 5/6 -> 10/11; max 10/11
    # q3: unanswerable, empty prediction -> EM 1, RW 1
    # q4: "seoul" == "seoul" -> EM 1, RW 1
    # EM = 2/4 ; RW = (5/6 + 10/11 + 2)/4
    out = klue_mrc_scores(preds, golds, types)
    assert out["exact_match"] == approx(50.0)
    assert out["rouge_w"] == approx(100 * (5 / 6 + 10 / 11 + 2) / 4)  # 93.5606
    assert out["exact_match_type1"] == approx(50.0)
    assert out["rouge_w_type1"] == approx(100 * (5 / 6 + 1) / 2)  # 91.6667
    assert out["exact_match_type2"] == approx(0.0)
    assert out["rouge_w_type2"] == approx(100 * 10 / 11)
    assert out["exact_match_type3"] == approx(100.0) and out["rouge_w_type3"] == approx(100.0)
    assert set(klue_mrc_scores(preds, golds)) == {"exact_match", "rouge_w"}
    # the same q1 under KorQuAD: EM 1
    assert korquad_em(preds["q1"], golds["q1"][0]) == 1.0


def test_klue_mrc_unanswerable_and_missing():
    golds = {"u1": [], "u2": [], "a1": ["서울"]}
    # u1: "()" normalizes to "" -> counts as the empty answer: 1, 1
    # u2: non-empty prediction on unanswerable -> 0, 0
    # a1: empty prediction on answerable -> 0, 0
    out = klue_mrc_scores({"u1": "()", "u2": "부산", "a1": ""}, golds)
    assert out["exact_match"] == approx(100 / 3) and out["rouge_w"] == approx(100 / 3)
    with pytest.raises(KeyError):
        klue_mrc_scores({"u1": ""}, golds)


# ---------------------------------------------------------------------------
# KLUE RE: micro F1 without no_relation, AUPRC (against sklearn, as KLUE-baseline computes them)
# ---------------------------------------------------------------------------
RE_LABELS = ["no_relation", "org:founded", "per:spouse", "per:origin"]


def _sklearn_re_micro_f1(preds, golds, labels):
    skm = pytest.importorskip("sklearn.metrics")
    scored = [c for c in labels if c != "no_relation"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return 100 * skm.f1_score(golds, preds, average="micro", labels=scored)


def _klue_baseline_auprc(probs, labels, num_classes, present_only=False):
    """KLUE-baseline klue_re_auprc, transcribed (30 classes there; num_classes here), with this
    scikit-learn; ``present_only``: the mean over classes with a gold example (kotune's)."""
    np = pytest.importorskip("numpy")
    skm = pytest.importorskip("sklearn.metrics")
    labels = np.eye(num_classes)[labels]
    score = np.zeros((num_classes,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # classes with no gold example
        for c in range(num_classes):
            targets_c = labels.take([c], axis=1).ravel()
            preds_c = probs.take([c], axis=1).ravel()
            precision, recall, _ = skm.precision_recall_curve(targets_c, preds_c)
            score[c] = skm.auc(recall, precision)
    if present_only:
        score = score[labels.sum(0) > 0]
    return np.average(score) * 100.0


def test_re_micro_f1_hand_made():
    gold = ["no_relation", "org:founded", "per:spouse", "per:spouse", "no_relation"]
    pred = ["org:founded", "org:founded", "per:spouse", "no_relation", "no_relation"]
    # scored classes only: tp = 2 (founded, spouse), fp = 1 (founded for a no_relation), fn = 1 (a spouse
    # predicted no_relation); the correct no_relation counts nowhere -> F1 = 4 / (4 + 1 + 1)
    assert klue_re_micro_f1(pred, gold, RE_LABELS) == approx(100 * 4 / 6)
    assert klue_re_micro_f1(pred, gold, RE_LABELS) == approx(_sklearn_re_micro_f1(pred, gold, RE_LABELS))
    # all no_relation on both sides: nothing scored -> 0, as sklearn's zero_division
    assert klue_re_micro_f1(["no_relation"] * 3, ["no_relation"] * 3, RE_LABELS) == 0.0


def test_re_micro_f1_matches_sklearn_random():
    rng = random.Random(1)
    for _ in range(30):
        gold = [rng.choice(RE_LABELS) for _ in range(50)]
        pred = [rng.choice(RE_LABELS) if rng.random() < 0.5 else g for g in gold]
        assert klue_re_micro_f1(pred, gold, RE_LABELS) == approx(_sklearn_re_micro_f1(pred, gold, RE_LABELS))


def test_re_auprc_hand_made():
    # one class, 4 examples: scores 0.9 (pos), 0.8 (neg), 0.7 (pos), 0.1 (neg)
    # PR points (recall, precision): (0.5, 1), (0.5, 0.5), (1, 2/3), (1, 0.5), then (0, 1)
    # trapezoids over recall: 0..0.5 at precision 1 -> 0.5; 0.5..1 between 0.5 and 2/3 -> 0.5 * 7/12
    probs = [[0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.9, 0.1]]
    golds = [1, 0, 1, 0]
    class1 = 0.5 + 0.5 * (0.5 + 2 / 3) / 2
    np = pytest.importorskip("numpy")
    expected = _klue_baseline_auprc(np.asarray(probs), np.asarray(golds), 2)
    assert klue_re_auprc(probs, golds) == approx(expected)
    skm = pytest.importorskip("sklearn.metrics")
    p, r, _ = skm.precision_recall_curve([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
    assert skm.auc(r, p) == approx(class1)
    # a perfect ranking of every class gives 100
    assert klue_re_auprc([[0.9, 0.1], [0.2, 0.8]], [0, 1]) == approx(100.0)


def test_re_auprc_matches_klue_baseline_random():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for trial in range(20):
        n, k = 60, 30
        golds = rng.integers(0, 8 if trial % 2 else k, size=n)  # odd trials: 22 classes never gold
        logits = rng.normal(size=(n, k))
        logits[np.arange(n), golds] += rng.uniform(0, 3)
        if trial % 3 == 0:
            logits = np.round(logits, 1)  # ties between scores
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        ours = klue_re_auprc(probs.tolist(), golds.tolist())
        assert ours == approx(_klue_baseline_auprc(probs, golds, k, present_only=True))
        if len(set(golds.tolist())) == k:
            assert ours == approx(_klue_baseline_auprc(probs, golds, k))  # every class gold: the same


def test_re_auprc_leaves_out_a_class_without_gold_examples():
    # class 2 is never gold: this scikit-learn sets its recall to 1 at every threshold (an area of
    # about its precision, 1/3 here); KLUE-baseline's 0.24.1 gives NaN. Left out, the mean is the
    # mean of the two defined areas (both 100: a perfect ranking).
    probs = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.7, 0.2, 0.1]]
    assert klue_re_auprc(probs, [0, 1, 0]) == approx(100.0)


# ---------------------------------------------------------------------------
# KLUE DP: against a transcription of KLUE-baseline's klue_dp_{uas,las}_{macro,micro}_f1
# ---------------------------------------------------------------------------


def _klue_baseline_dp(head_preds, head_labels, type_preds, type_labels):
    """KLUE-baseline's four DP metrics on flat lists (its -1 padding included), transcribed."""
    np = pytest.importorskip("numpy")
    skm = pytest.importorskip("sklearn.metrics")
    head_preds, head_labels = np.array(head_preds), np.array(head_labels)
    type_preds, type_labels = np.array(type_preds), np.array(type_labels)
    index = [i for i, label in enumerate(head_labels) if label == -1]
    head_preds = np.delete(head_preds, index)
    head_labels = np.delete(head_labels, index)
    index = [i for i, label in enumerate(type_labels) if label == -1]
    type_preds = np.delete(type_preds, index)
    type_labels = np.delete(type_labels, index)
    out = {"uas_macro_f1": skm.f1_score(head_labels.tolist(), head_preds.tolist(), average="macro") * 100.0,
           "uas_micro_f1": skm.f1_score(head_labels.tolist(), head_preds.tolist(), average="micro") * 100.0}
    others_idx = 15
    for i, (pred, label) in enumerate(zip(type_preds, type_labels)):
        if pred >= others_idx:
            type_preds[i] = -3
        if label >= others_idx:
            type_labels[i] = -3
    PAD = -2
    uas_correct = np.equal(head_preds, head_labels)
    uas_incorrect = np.nonzero(np.invert(uas_correct))
    for idx in uas_incorrect:
        type_preds[idx] = PAD
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["las_macro_f1"] = skm.f1_score(type_labels.tolist(), type_preds.tolist(), average="macro") * 100.0
        out["las_micro_f1"] = skm.f1_score(type_labels.tolist(), type_preds.tolist(), average="micro") * 100.0
    return out


def _flat(rows):
    return [x for row in rows for x in row]


def test_dp_hand_made():
    # two sentences; word heads (0 = root) and type ids in KLUE-baseline's order (15+ = others)
    gold_h, gold_t = [[3, 3, 0], [2, 0]], [[3, 5, 2], [16, 2]]
    pred_h, pred_t = [[3, 1, 0], [2, 0]], [[3, 5, 2], [20, 2]]
    out = klue_dp_scores(pred_h, pred_t, gold_h, gold_t)
    # UAS micro: 4 of 5 heads right
    assert out["uas_micro_f1"] == approx(80.0)
    # LAS: word 2 has a wrong head -> class -2; 16 and 20 both merge into "others" -> right
    # classes {3: 1/1, 5: gold only -> 0, 2: 2/2, others: 1/1, -2: pred only -> 0}: macro = 3 / 5
    assert out["las_micro_f1"] == approx(80.0)
    assert out["las_macro_f1"] == approx(60.0)
    ref = _klue_baseline_dp(_flat(pred_h), _flat(gold_h), _flat(pred_t), _flat(gold_t))
    assert out == pytest.approx(ref, abs=1e-9)


def test_dp_matches_klue_baseline_random():
    rng = random.Random(3)
    for _ in range(25):
        gold_h, gold_t, pred_h, pred_t = [], [], [], []
        for _ in range(rng.randrange(1, 12)):
            n = rng.randrange(1, 15)
            gh = [rng.randrange(0, n + 1) for _ in range(n)]
            gt = [rng.randrange(38) for _ in range(n)]
            ph = [h if rng.random() < 0.7 else rng.randrange(0, n + 1) for h in gh]
            pt = [t if rng.random() < 0.6 else rng.randrange(38) for t in gt]
            if rng.random() < 0.3:  # KLUE-baseline's padding: unscored words
                gh[-1] = gt[-1] = -1
            gold_h.append(gh), gold_t.append(gt), pred_h.append(ph), pred_t.append(pt)
        ours = klue_dp_scores(pred_h, pred_t, gold_h, gold_t)
        ref = _klue_baseline_dp(_flat(pred_h), _flat(gold_h), _flat(pred_t), _flat(gold_t))
        assert ours == pytest.approx(ref, abs=1e-9)
