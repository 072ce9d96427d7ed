"""task=sentence_embedding (a bi-encoder trained with sentence-transformers' losses): its metrics are
sentence-transformers' evaluators', its SentenceTransformer pools as kotune does, each data shape trains
with its loss, every action answers or refuses in one line, the exports give kotune's embeddings
(sentence-transformers' format to 1e-5, ONNX to 1e-4), and bad files are one line naming file and row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, compose, shared_path
from test_action_matrix import job, ok, refused_in_one_line as refused

TINY = ["task=sentence_embedding", "model=tiny", "data=sample", "train.batch_size=16", "train.logging_steps=1"]
TEXTS = ["서울에서 회의가 열렸다.", "오늘 날씨가 맑다.", "내일은 비가 온다고 한다 그래서 우산을 챙겼다.", "짧다"]


def random_bert(tmp_path: Path, layers: int = 4):
    """A random 4-layer BERT (hidden 32) and a WordPiece tokenizer of the test texts' characters."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted({c for t in TEXTS for c in t if not c.isspace()})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]), encoding="utf-8")
    tokenizer = BertTokenizerFast(str(vocab), do_lower_case=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64)
    return BertModel(config, add_pooling_layer=False).eval(), tokenizer


# ---- the metrics are sentence-transformers' --------------------------------------------------
def test_spearman_pearson_recall_and_mrr_equal_sentence_transformers_evaluators(tmp_path):
    from sentence_transformers.sentence_transformer.evaluation import (EmbeddingSimilarityEvaluator,
                                                                       InformationRetrievalEvaluator)

    from heads.model.sentence_transformer import build_sentence_transformer
    from tasks.embedding_metrics import paired_cosines, retrieval_scores, similarity_scores

    encoder, tokenizer = random_bert(tmp_path)
    st = build_sentence_transformer(encoder, tokenizer, pooling="mean", device="cpu")
    first, second = TEXTS, TEXTS[1:] + TEXTS[:1]
    gold = [4.0, 1.0, 2.5, 0.5]
    theirs = EmbeddingSimilarityEvaluator(first, second, gold, similarity_fn_names=["cosine"])(st)
    ours = similarity_scores(paired_cosines(st.encode(first), st.encode(second)), gold)
    # the same scipy calls; the evaluator's cosines are float32 (torch), ours float64: equal to rounding
    assert ours["spearman"] == pytest.approx(100 * theirs["spearman_cosine"], abs=1e-4)
    assert ours["pearson"] == pytest.approx(100 * theirs["pearson_cosine"], abs=1e-4)
    queries = {"q0": TEXTS[0], "q1": TEXTS[3]}
    corpus = {f"d{i}": t for i, t in enumerate(TEXTS[1:] + ["다른 문장", "또 다른 문장"])}
    relevant = {"q0": {"d0", "d2"}, "q1": {"d3"}}
    theirs = InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=[10], precision_recall_at_k=[1, 5, 10],
                                           score_functions={"cosine": __import__("sentence_transformers").util.cos_sim})(st)
    ids = list(corpus)
    ours = retrieval_scores(st.encode(list(queries.values())), st.encode(list(corpus.values())),
                            [{ids.index(d) for d in relevant[q]} for q in queries])
    for k in (1, 5, 10):
        assert ours[f"recall@{k}"] == pytest.approx(100 * theirs[f"cosine_recall@{k}"], abs=1e-6)
    assert ours["mrr@10"] == pytest.approx(100 * theirs["cosine_mrr@10"], abs=1e-6)


@pytest.mark.parametrize("recall_at", [(1, 5, 10), (1, 5, 20)])
def test_mrr_at_10_stops_at_rank_10(recall_at):
    """11 documents at falling cosines to one query: the relevant one at rank 11 scores 0 in MRR@10
    (recall@20 reads deeper, MRR does not), at rank 10 it scores 1/10, at rank 1 it scores 1."""
    import math

    from tasks.embedding_metrics import retrieval_scores

    documents = [[math.cos(0.1 * i), math.sin(0.1 * i)] for i in range(11)]  # rank i + 1 for the query [1, 0]
    query = [[1.0, 0.0]]
    assert retrieval_scores(query, documents, [{10}], recall_at)["mrr@10"] == 0.0
    assert retrieval_scores(query, documents, [{9}], recall_at)["mrr@10"] == pytest.approx(10.0)
    assert retrieval_scores(query, documents, [{0}], recall_at)["mrr@10"] == pytest.approx(100.0)
    both = retrieval_scores(query * 2, documents, [{10}, {1}], recall_at)
    assert both["mrr@10"] == pytest.approx(100 * (0 + 1 / 2) / 2)
    if 20 in recall_at:
        assert both["recall@20"] == 100.0


@pytest.mark.parametrize("layers,pooling", [("last", "cls"), ("last", "mean"), ("last4_mean", "mean"), (2, "mean"),
                                            ("[1,3]", "cls")])
def test_the_sentence_transformer_pools_as_kotune_does(layers, pooling, tmp_path):
    from heads.model.layers import LayerMixer, parse_layers, pool
    from heads.model.sentence_transformer import build_sentence_transformer

    encoder, tokenizer = random_bert(tmp_path)
    st = build_sentence_transformer(encoder, tokenizer, layers=layers, pooling=pooling, device="cpu")
    mixer = LayerMixer(parse_layers(layers, 4))
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = pool(mixer(mixer.states(encoder, batch["input_ids"], batch["attention_mask"])), batch["attention_mask"],
                    pooling)
    assert np.allclose(st.encode(TEXTS), ours.numpy(), atol=1e-5)


def test_a_layer_choice_with_no_stock_module_is_refused_in_one_line(tmp_path):
    from heads.model.sentence_transformer import build_sentence_transformer
    from kotune.core.errors import ConfigError

    encoder, tokenizer = random_bert(tmp_path)
    for layers in ("scalar_mix", "last4_concat"):
        with pytest.raises(ConfigError, match=f"mode.layers={layers}: a sentence embedding reads one state"):
            build_sentence_transformer(encoder, tokenizer, layers=layers)


# ---- one trained bi-encoder, every action ------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("bi-encoder")
    res = ok(job([*TINY, "train.max_steps=6"], root / "train", cache_dir))
    texts = root / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    embedded = ok(job([*TINY, "action=embed", f"checkpoint={root / 'train'}", f"embed.input={texts}"], root / "embed",
                      cache_dir))
    return {"root": root, "train": res, "cache": cache_dir, "texts": texts,
            "vectors": np.load(embedded["embeddings_file"]), "embed": embedded}


def test_training_moves_the_encoder_and_eval_gives_the_training_runs_metrics(trained):
    from heads.model.kotune_model import KotuneModel

    res = trained["train"]
    assert res["head"] == "bi_encoder" and res["stages"][0]["loss"] == "cosent" and res["stages"][0]["steps"] == 6
    assert set(res["metrics"]) == {"spearman", "pearson"} and res["main_score"] == res["metrics"]["spearman"]
    again = ok(job([*TINY, "action=eval", f"checkpoint={trained['root'] / 'train'}"], trained["root"] / "eval",
                   trained["cache"]))
    assert again["metrics"] == pytest.approx(res["metrics"], abs=1e-6)
    from heads.model.encoder import load_encoder

    cfg = compose(TINY)
    model = KotuneModel.load(str(trained["root"] / "train" / "model"))
    fresh = load_encoder(cfg.model, vocab_size=model.encoder.config.vocab_size, seed=int(cfg.train.seed))
    moved = [k for k, v in fresh.state_dict().items() if k in model.encoder.state_dict()
             and not torch.equal(v, model.encoder.state_dict()[k])]
    assert len(moved) > 10, "the encoder did not train"
    assert trained["embed"]["dim"] == 128 and trained["embed"]["pooling"] == "mean"


def test_predict_gives_each_pairs_cosine_and_each_texts_embedding(trained):
    root = trained["root"]
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"sentence1": a, "sentence2": b}, ensure_ascii=False) + "\n"
                             for a, b in zip(TEXTS, TEXTS[1:])), encoding="utf-8")
    res = ok(job([*TINY, "action=predict", f"checkpoint={root / 'train'}", f"data.predict_file={pairs}"],
                 root / "predict", trained["cache"]))
    got = [json.loads(line)["similarity"] for line in Path(res["predictions_file"]).read_text().splitlines()]
    unit = trained["vectors"] / np.linalg.norm(trained["vectors"], axis=1, keepdims=True)
    assert got == pytest.approx([float(unit[i] @ unit[i + 1]) for i in range(3)], abs=1e-5)
    texts = write_jsonl(root / "texts.jsonl", [{"text": t} for t in TEXTS])
    single = ok(job([*TINY, "action=predict", f"checkpoint={root / 'train'}", f"data.predict_file={texts}"],
                    root / "predict-texts", trained["cache"]))
    rows = [json.loads(line)["embedding"] for line in Path(single["predictions_file"]).read_text().splitlines()]
    assert np.allclose(rows, trained["vectors"], atol=1e-5)


def test_the_sentence_transformers_export_encodes_as_kotune_embeds(trained, capfd):
    from sentence_transformers import SentenceTransformer

    root = trained["root"]
    res = ok(job([*TINY, "action=export", f"checkpoint={root / 'train'}", "export.format=sentence_transformers"],
                 root / "export-st", trained["cache"]))
    capfd.readouterr()
    st = SentenceTransformer(res["export_dir"], device="cpu")
    loading = capfd.readouterr()
    assert "MISSING" not in loading.out + loading.err  # the pooler BERT builds is in the export (unused)
    assert np.allclose(st.encode(TEXTS), trained["vectors"], atol=1e-5)
    card = (Path(res["export_dir"]) / "README.md").read_text(encoding="utf-8")
    assert "pipeline_tag: sentence-similarity" in card and "SentenceTransformer(" in card
    pooling = json.loads((Path(res["export_dir"]) / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "mean"


def test_the_onnx_export_gives_kotunes_embeddings_and_int8_is_close(trained):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    root = trained["root"]
    res = ok(job([*TINY, "action=export", f"checkpoint={root / 'train'}", "export.format=onnx", "export.quantize=int8"],
                 root / "export-onnx", trained["cache"]))
    folder = Path(res["export_dir"])
    batch = AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="np")
    out = {}
    for name in res["onnx_files"]:
        session = ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
        out[name] = session.run(None, {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()})[0]
    assert np.allclose(out["model.onnx"], trained["vectors"], atol=1e-4)
    import kotune  # the export behind kotune.load (and action=serve): the same vectors

    answers = kotune.load(folder, "onnx.file=model.onnx")(TEXTS)
    assert np.allclose([r["embedding"] for r in answers], trained["vectors"], atol=1e-4)
    scored = ok(job([*TINY, "action=eval", f"checkpoint={folder}", "onnx.file=model.onnx"], root / "eval-onnx",
                    trained["cache"]))
    assert scored["metrics"] == pytest.approx(trained["train"]["metrics"], abs=1e-3)
    cosines = (out["model_int8.onnx"] * trained["vectors"]).sum(1) / np.linalg.norm(out["model_int8.onnx"], axis=1) \
        / np.linalg.norm(trained["vectors"], axis=1)
    assert cosines.min() > 0.99


def test_kotune_load_answers_embeddings_and_embed_agrees(trained):
    import kotune

    predictor = kotune.load(trained["root"] / "train")
    answers = np.array([r["embedding"] for r in predictor(TEXTS)])
    assert np.allclose(answers, trained["vectors"], atol=1e-5)
    assert np.allclose(predictor.embed(TEXTS), trained["vectors"], atol=1e-5)


def test_the_server_answers_post_embed(trained):
    import httpx

    from bench.serving import free_port, stop_server, wait_for_health

    root, port = trained["root"], free_port()
    log = open(root / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "action=serve", f"checkpoint={root / 'train'}",
                             f"serve.port={port}", f"cache_dir={trained['cache']}", f"hydra.run.dir={root / 'serve'}"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_health(proc, f"http://127.0.0.1:{port}", timeout_s=180)
        answer = httpx.post(f"http://127.0.0.1:{port}/embed", json={"inputs": TEXTS}, timeout=60)
        assert answer.status_code == 200, answer.text
        got = np.array([r["embedding"] for r in answer.json()["predictions"]])
        assert np.allclose(got, trained["vectors"], atol=1e-5)
    finally:
        stop_server(proc)


@pytest.mark.parametrize("action,extra,error", [
    ("score", ["score.predictions=x.jsonl"], "action=score does not apply to task=sentence_embedding"),
    ("ceiling", [], "action=ceiling does not apply to task=sentence_embedding: a sentence vector has no token"),
    ("probe", [], "action=probe does not apply to task=sentence_embedding"),
    ("label_issues", [], "action=label_issues does not apply to task=sentence_embedding"),
    ("export", [], "the bi_encoder head has no native transformers class: a sentence embedding: "
                   "export.format=sentence_transformers (or onnx) writes it"),
    ("train", ["mode=frozen"], "mode=frozen: a bi-encoder's only weights are its encoder's"),
    ("train", ["train=klue"], "train.select_best: a sentence_embedding run is scored once"),
    ("train", ["mode.layers=scalar_mix"], "mode.layers=scalar_mix: a sentence embedding reads one state per token"),
])
def test_what_makes_no_sense_for_a_bi_encoder_is_refused_in_one_line(trained, action, extra, error):
    checkpoint = [] if action == "train" else [f"checkpoint={trained['root'] / 'train'}"]
    res = job([*TINY, f"action={action}", *checkpoint, *extra], trained["root"] / f"refused-{action}", trained["cache"])
    assert error in refused(res)


# ---- the other shapes: triplets, NLI pairs, queries, two stages ------------------------------------
def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def sts_pairs() -> list[dict]:
    return json.loads((ROOT / "tasks" / "samples" / "sts" / "train.json").read_text(encoding="utf-8"))


def triplet_rows() -> list[dict]:
    pairs = sts_pairs()
    return [{"anchor": p["sentence1"], "positive": p["sentence2"], "negative": pairs[(i + 7) % len(pairs)]["sentence2"]}
            for i, p in enumerate(pairs) if p["labels"]["real-label"] >= 2.5]


def test_triplets_nli_pairs_and_queries_train_with_in_batch_negatives(tmp_path, cache_dir):
    rows = triplet_rows()
    train = write_jsonl(tmp_path / "triplets.jsonl", rows[:-6])
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"query": r["anchor"], "relevant": [r["positive"]]}
                                                       for r in rows[-6:]])
    res = ok(job([*TINY, f"data.train_file={train}", f"data.validation_file={queries}", "task.main_metric=mrr@10",
                  "train.max_steps=3"], tmp_path / "triplets", cache_dir))
    assert res["stages"][0]["shape"] == "triplet" and res["stages"][0]["loss"] == "mnrl"
    assert set(res["metrics"]) == {"recall@1", "recall@5", "recall@10", "mrr@10"} and res["n_eval"] == 6
    assert res["metrics"]["recall@10"] == 100.0  # six queries, eight documents: each relevant one in the top 10
    nli = ROOT / "tasks" / "samples" / "nli"
    res = ok(job([*TINY, f"data.train_file={nli / 'train.json'}", f"data.validation_file={nli / 'dev.json'}",
                  "task.main_metric=mrr@10", "train.max_steps=2"], tmp_path / "nli", cache_dir))
    assert res["stages"][0]["shape"] == "nli" and res["stages"][0]["loss"] == "mnrl"


def test_nli_pairs_become_triplets_in_both_directions(tmp_path):
    """sentence-transformers' NLI recipe: (anchor, entailed, contradicted) and (entailed, anchor,
    contradicted); a pair counts both ways, so a hypothesis entailed by one sentence and contradicted
    by another is an anchor of its own."""
    from tasks import build_task

    task = build_task(compose(["task=sentence_embedding"]).task)
    rows = [("전제 A", "함의 A", "entailment"), ("전제 A", "중립 A", "neutral"), ("전제 A", "모순 A", "contradiction"),
            ("전제 B", "함의 B", "entailment"), ("전제 C", "함의 C1", "entailment"), ("전제 C", "함의 C2", "entailment"),
            ("전제 C", "모순 C", "contradiction"), ("전제 D", "함의 A", "contradiction")]
    path = tmp_path / "nli.tsv"
    path.write_text("sentence1\tsentence2\tgold_label\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows), encoding="utf-8")
    got = [(ex["anchor"], ex["positive"], ex["negative"]) for ex in task.read_file(str(path))]
    assert got == [("전제 A", "함의 A", "모순 A"), ("함의 A", "전제 A", "모순 A"),
                   ("함의 A", "전제 A", "전제 D"), ("전제 A", "함의 A", "전제 D"),
                   ("전제 C", "함의 C1", "모순 C"), ("함의 C1", "전제 C", "모순 C"),
                   ("전제 C", "함의 C2", "모순 C"), ("함의 C2", "전제 C", "모순 C")]


@pytest.mark.slow
def test_kornli_xnli_test_gives_the_recipes_triplet_count():
    """The 5,010 pairs of KorNLI's XNLI test: 1,670 premises, each with one entailment and one
    contradiction; sentence-transformers' recipe makes 2 triplets of each, 3,340."""
    from tasks import build_task

    path = shared_path("data/kornli/xnli.test.ko.tsv")
    task = build_task(compose(["task=sentence_embedding"]).task)
    assert len(task.read_file(str(path))) == 3340


def test_two_stages_train_one_model_in_turn(tmp_path, cache_dir):
    train = write_jsonl(tmp_path / "triplets.jsonl", triplet_rows())
    sts = ROOT / "tasks" / "samples" / "sts"
    res = ok(job([*TINY, "data=hub", f"data.validation_file={sts / 'dev.json'}",
                  f"task.stages=[{{file: {train}, max_steps: 2}}, {{file: {sts / 'train.json'}, max_steps: 3}}]"],
                 tmp_path / "two", cache_dir))
    assert [(s["shape"], s["loss"], s["steps"]) for s in res["stages"]] == [("triplet", "mnrl", 2), ("scored", "cosent", 3)]
    assert res["data"]["train"]["file"] == str(train) and res["data"]["stage2"]["file"] == str(sts / "train.json")
    assert "spearman" in res["metrics"]


# ---- bad input: one line naming the file and the row ------------------------------------------
@pytest.mark.parametrize("name,content,error", [
    ("pairs.tsv", "sentence1\tsentence2\n하나\t둘\n", "pairs.tsv:2: a sentence pair needs a score or a label"),
    ("triplets.jsonl", '{"anchor": "a", "positive": "b", "negative": "c"}\n{"anchor": "a", "positive": " ", '
                       '"negative": "c"}\n', "triplets.jsonl:2: the triplet's positive ('positive') is empty"),
    ("queries.jsonl", '{"query": "무엇", "relevant": ["답"]}\n{"query": "어디", "relevant": []}\n',
     "queries.jsonl:2: query '어디' has no relevant documents"),
    ("scores.tsv", "sentence1\tsentence2\tscore\n하나\t둘\t3.5\n셋\t넷\tmaybe\n", "scores.tsv:3: 'score' is 'maybe'"),
])
def test_a_bad_file_is_one_line_naming_file_and_row(tmp_path, cache_dir, name, content, error):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    sts = ROOT / "tasks" / "samples" / "sts" / "dev.json"
    res = job([*TINY, f"data.train_file={path}", f"data.validation_file={sts}"], tmp_path / "run", cache_dir)
    assert error in refused(res)


def test_a_main_metric_the_validation_file_cannot_give_is_refused(tmp_path, cache_dir):
    res = job([*TINY, "task.main_metric=mrr@10", "train.max_steps=1"], tmp_path / "run", cache_dir)
    assert "task.main_metric=mrr@10:" in refused(res) and "set task.main_metric=spearman" in res["error"]


def test_a_sweep_runs_its_trials(tmp_path, cache_dir):
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", *TINY, "train.max_steps=2", "train.seed=1,2",
                          f"cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    found = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("results.json")]
    assert len(found) == 2 and all(r["status"] == "ok" and "spearman" in r["metrics"] for r in found)


@pytest.mark.slow
def test_the_two_stage_preset_on_korean_data(tmp_path, cache_dir):
    shared_path("data/kornli/xnli.test.ko.tsv")
    shared_path("data/korsts/sts-train.tsv")
    shared_path("data/klue/klue-sts-v1.1_dev.json")
    stages = ("task.stages=[{file: ../shared/data/kornli/xnli.test.ko.tsv, max_steps: 5}, "
              "{file: ../shared/data/korsts/sts-train.tsv, max_steps: 5}]")
    res = ok(job(["task=sentence_embedding_kor", "model=tiny", "data=hub", stages, "train.batch_size=32"],
                 tmp_path / "kor", cache_dir))
    assert [s["shape"] for s in res["stages"]] == ["nli", "scored"] and res["n_eval"] == 519
    assert -100 <= res["metrics"]["spearman"] <= 100


def test_a_layer_choice_and_pooling_travel_into_every_export(tmp_path, cache_dir):
    """mode.layers=last4_mean mode.pooling=cls on a 4-layer encoder: action=embed, the
    sentence-transformers export (WeightedLayerPooling + Pooling configs) and the ONNX export agree."""
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    four = [*TINY, "model.config_overrides.num_hidden_layers=4", "mode.layers=last4_mean", "mode.pooling=cls"]
    ok(job([*four, "train.max_steps=2"], tmp_path / "train", cache_dir))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    embedded = ok(job([*TINY, "action=embed", f"checkpoint={tmp_path / 'train'}", f"embed.input={texts}"],
                      tmp_path / "embed", cache_dir))
    assert (embedded["layers"], embedded["pooling"]) == ("last4_mean", "cls")
    vectors = np.load(embedded["embeddings_file"])
    st = ok(job([*TINY, "action=export", f"checkpoint={tmp_path / 'train'}", "export.format=sentence_transformers"],
                tmp_path / "st", cache_dir))
    assert np.allclose(SentenceTransformer(st["export_dir"], device="cpu").encode(TEXTS), vectors, atol=1e-5)
    onnx = ok(job([*TINY, "action=export", f"checkpoint={tmp_path / 'train'}", "export.format=onnx"], tmp_path / "onnx",
                  cache_dir))
    folder = Path(onnx["export_dir"])
    batch = AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="np")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = session.run(None, {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()})[0]
    assert np.allclose(out, vectors, atol=1e-4)


def test_the_embedding_size_is_read_without_sentence_transformers_rename_warning():
    """sentence-transformers 6 renamed get_sentence_embedding_dimension to get_embedding_dimension
    (the old name warns, FutureWarning); 5.x has only the old one."""
    import warnings

    from kotune.embeddings.export import embedding_dimension

    class Five:
        def get_sentence_embedding_dimension(self) -> int:
            return 8

    class Six(Five):
        def get_sentence_embedding_dimension(self) -> int:
            warnings.warn("renamed to get_embedding_dimension", FutureWarning)
            return 8

        def get_embedding_dimension(self) -> int:
            return 8

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert embedding_dimension(Five()) == embedding_dimension(Six()) == 8
