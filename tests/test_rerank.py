"""``action=rerank`` (kotune/actions/rerank.py, tasks/rerank.py): a pair model scores (query,
candidate) pairs; the same rankings from a run directory, its native export and its ONNX export;
sentence-transformers' ``CrossEncoder`` loads the native export with equal scores; bad input is one
line naming the file and row; a task that reads no pairs is refused in one line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kotune.core.errors import ConfigError, DataError
from tasks import rerank

QUERY = "커피 마시면 잠이 깨는 이유가 뭘까요?"
CANDIDATES = ["커피를 마시면 왜 잠이 안 오나요?", "화분에 물은 얼마나 자주 줘야 하나요?", "감기와 독감의 차이는 무엇인가요?",
              "연말정산 환급금은 언제 들어오나요?"]
TRAIN = ["model=tiny", "data=sample", "train.max_steps=3", "train.batch_size=8"]


# ---- the text side (tasks/rerank.py): pure functions ----------------------------------------
def test_the_positive_label_is_the_one_named_like_a_match_or_the_one_asked():
    assert rerank.positive_label(["duplicate", "not_duplicate"], None) == "duplicate"
    assert rerank.positive_label(["entailment", "neutral", "contradiction"], None) == "entailment"
    assert rerank.positive_label(["0", "1"], None) == "1"
    assert rerank.positive_label(["a", "b"], "a") == "a"
    with pytest.raises(ConfigError, match="rerank.positive_label=LABEL .* labels: a, b"):
        rerank.positive_label(["a", "b"], None)
    with pytest.raises(ConfigError, match="rerank.positive_label=c is not a label"):
        rerank.positive_label(["a", "b"], "c")


def test_scores_are_the_regression_value_or_the_positive_labels_softmax_probability():
    logits = np.array([[2.0, 0.0], [0.0, 1.0]])
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert rerank.pair_scores(logits, ["yes", "no"], "yes") == pytest.approx(probs[:, 0].tolist())
    assert rerank.pair_scores(np.array([[3.5], [1.25]]), None, None) == [3.5, 1.25]


def test_a_ranking_is_best_first_ties_in_file_order_cut_at_top_k():
    cands = [{"row": str(i), "text": t} for i, t in enumerate("abcd", 1)]
    record = rerank.ranking({"row": "query", "text": "q"}, cands, [0.1, 0.7, 0.7, 0.9], top_k=3)
    assert [c["text"] for c in record["ranked"]] == ["d", "b", "c"]
    assert [c["rank"] for c in record["ranked"]] == [1, 2, 3] and record["query"] == "q"
    assert len(rerank.ranking({"row": "q", "text": "q"}, cands, [0] * 4, None)["ranked"]) == 4
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="rerank.top_k"):
            rerank.check_top_k(bad)


def test_bad_input_is_one_line_naming_the_file_and_row(tmp_path):
    empty = tmp_path / "cands.csv"
    empty.write_text("id,text\n1,좋은 문장\n2,\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"cands.csv:3: rerank.candidate_column 'text': empty"):
        rerank.read_candidates(str(empty), None)
    other = tmp_path / "queries.jsonl"
    other.write_text(json.dumps({"question": "질문"}, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"queries.jsonl"):
        rerank.read_queries(None, str(other), None)
    with pytest.raises(DataError, match="file not found"):
        rerank.read_candidates(str(tmp_path / "none.csv"), None)
    with pytest.raises(ConfigError, match="one of rerank.query=TEXT"):
        rerank.read_queries("질문", str(other), None)
    with pytest.raises(ConfigError, match="rerank.candidates=FILE"):
        rerank.read_candidates(None, None)
    named = tmp_path / "named.jsonl"
    named.write_text(json.dumps({"query": "질문 하나"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert rerank.read_queries(None, str(named), None) == [{"row": "1", "text": "질문 하나"}]


# ---- the action, from a run, a native export and an ONNX export -------------------------------
@pytest.fixture(scope="module")
def pair_models(tmp_path_factory, cache_dir):
    """A tiny text_pair (duplicate / not_duplicate) and a tiny sts (regression) run, each exported natively and to ONNX."""
    from conftest import compose

    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    root = tmp_path_factory.mktemp("rerank")
    out = {}
    for task in ("text_pair", "sts"):
        run = root / task
        assert execute(compose([f"task={task}", *TRAIN, f"cache_dir={cache_dir}"]), str(run))["status"] == "ok"
        for fmt in ("native", "onnx"):
            res = execute(compose(["action=export", f"checkpoint={run}", f"export.format={fmt}",
                                   f"export.dir={root / f'{task}-{fmt}'}"]), str(root / f"export-{task}-{fmt}"))
            assert res["status"] == "ok", res.get("error")
        out[task] = run
    (root / "cands.txt").write_text("\n".join(CANDIDATES) + "\n", encoding="utf-8")
    return root, out


def reranked(root: Path, checkpoint: Path, name: str, *extra: str) -> dict:
    from conftest import compose

    from kotune.cli.job import execute

    return execute(compose(["action=rerank", f"checkpoint={checkpoint}", f"rerank.query={QUERY}",
                            f"rerank.candidates={root / 'cands.txt'}", *extra]), str(root / name))


@pytest.mark.parametrize("task", ["text_pair", "sts"])
def test_a_run_its_native_and_its_onnx_export_rank_alike_and_crossencoder_scores_equal(pair_models, task):
    from sentence_transformers import CrossEncoder

    root, runs = pair_models
    rankings = {}
    for source in ("", "-native", "-onnx"):
        res = reranked(root, root / f"{task}{source}", f"rerank-{task}{source}")
        assert res["status"] == "ok", res.get("error")
        assert (res["n_queries"], res["n_candidates"], res["n_pairs"]) == (1, 4, 4)
        lines = Path(res["rankings_file"]).read_text(encoding="utf-8").splitlines()
        rankings[source] = json.loads(lines[0])["ranked"]
    assert res["score"] == ("the regression value" if task == "sts" else "the probability of label duplicate")
    ours = {c["text"]: c["score"] for c in rankings[""]}
    for source in ("-native", "-onnx"):
        assert [c["text"] for c in rankings[source]] == [c["text"] for c in rankings[""]]
        assert [c["score"] for c in rankings[source]] == pytest.approx([c["score"] for c in rankings[""]], abs=1e-4)
    scores = [c["score"] for c in rankings[""]]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    # the native export in sentence-transformers' CrossEncoder: the same score for each pair
    model = CrossEncoder(str(root / f"{task}-native"))
    theirs = model.predict([(QUERY, c) for c in CANDIDATES], apply_softmax=task != "sts")
    theirs = np.asarray(theirs).reshape(len(CANDIDATES), -1)[:, 0]  # duplicate is label 0
    assert theirs.tolist() == pytest.approx([ours[c] for c in CANDIDATES], abs=1e-5)


def test_the_scores_are_what_predict_gives_the_pairs(pair_models, tmp_path):
    """predict's probability of the positive label for each (query, candidate) row, to its 4 digits."""
    root, runs = pair_models
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text": QUERY, "text_pair": c}, ensure_ascii=False) + "\n"
                             for c in CANDIDATES), encoding="utf-8")
    from conftest import compose

    from kotune.cli.job import execute

    predicted = execute(compose(["action=predict", f"checkpoint={runs['text_pair']}", f"data.predict_file={pairs}"]),
                        str(tmp_path / "predict"))
    assert predicted["status"] == "ok", predicted.get("error")
    records = [json.loads(line) for line in Path(predicted["predictions_file"]).read_text().splitlines()]
    res = reranked(root, runs["text_pair"], "rerank-vs-predict", "rerank.top_k=2")
    ranked = json.loads(Path(res["rankings_file"]).read_text().splitlines()[0])["ranked"]
    assert len(ranked) == 2
    by_text = {r["text_pair"]: r["probabilities"]["duplicate"] for r in records}
    for c in ranked:
        assert c["score"] == pytest.approx(by_text[c["text"]], abs=1e-4)


def test_a_queries_file_ranks_each_query_and_a_bad_row_is_named(pair_models, tmp_path):
    root, runs = pair_models
    queries = tmp_path / "queries.csv"
    queries.write_text(f"query\n{QUERY}\n감기 걸리면 샤워해도 되나요?\n", encoding="utf-8")
    from conftest import compose

    from kotune.cli.job import execute

    res = execute(compose(["action=rerank", f"checkpoint={runs['sts']}", f"rerank.queries={queries}",
                           f"rerank.candidates={root / 'cands.txt'}"]), str(tmp_path / "many"))
    assert res["status"] == "ok" and res["n_pairs"] == 8
    records = [json.loads(line) for line in Path(res["rankings_file"]).read_text().splitlines()]
    assert [r["query_row"] for r in records] == ["2", "3"] and all(len(r["ranked"]) == 4 for r in records)
    queries.write_text(f"id,query\n1,{QUERY}\n2,  \n", encoding="utf-8")
    bad = execute(compose(["action=rerank", f"checkpoint={runs['sts']}", f"rerank.queries={queries}",
                           f"rerank.candidates={root / 'cands.txt'}"]), str(tmp_path / "bad"))
    assert bad["status"] == "failed" and "\n" not in bad["error"]
    assert f"{queries}:3: rerank.query_column 'query': empty" in bad["error"]


def test_a_task_that_reads_no_pairs_is_refused_in_one_line(run_job, tmp_path):
    trained = run_job(["task=text_cls", *TRAIN], "cls")
    assert trained["status"] == "ok", trained.get("error")
    (tmp_path / "c.txt").write_text("하나\n둘\n", encoding="utf-8")
    res = run_job(["action=rerank", f"checkpoint={tmp_path / 'cls'}", "rerank.query=질문",
                   f"rerank.candidates={tmp_path / 'c.txt'}"], "refused")
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert res["error"].startswith("action=rerank: task text_cls scores one text")
    res = run_job(["action=rerank", "rerank.query=질문", f"rerank.candidates={tmp_path / 'c.txt'}"], "nothing")
    assert res["status"] == "failed" and res["error"].startswith("action=rerank needs checkpoint=")
