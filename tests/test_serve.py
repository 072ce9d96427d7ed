"""From a trained model to answers: the ONNX export on the demo set (logits = kotune's to 1e-4 on
all 471 dev comments, int8 labels agree with fp32, predict/eval from the export = from the
checkpoint), the model card the Hub would read, and ``action=serve`` as a real server process on
127.0.0.1: 64 concurrent requests through a real HTTP client, each answered as ``action=predict``
answered, bad requests refused with a 4xx JSON error while the server goes on serving."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, compose

# trained far enough that its labels spread over the three classes (fewer steps: all "none"), so
# agreement is not the trivial all-majority kind
DEMO = ["task=text_cls", "model=tiny", "data=demo"]
TRAIN = ["data.max_train_samples=1000", "train.max_steps=150"]
N_REQUESTS = 64


def job(overrides: list[str], run_dir: Path, cache_dir: str) -> dict:
    from kotune.job import execute
    from kotune.runtime import quiet_libraries

    quiet_libraries()
    res = execute(compose(overrides + [f"cache_dir={cache_dir}"]), str(run_dir))
    assert res["status"] == "ok", res.get("error")
    return res


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, cache_dir):
    """A tiny model trained on the demo set, its ONNX export (fp32 + int8), and a 64-comment file."""
    root = tmp_path_factory.mktemp("serve")
    job([*DEMO, *TRAIN], root / "train", cache_dir)
    export = job([*DEMO, "action=export", "export.format=onnx", "export.quantize=int8", "export.license=cc-by-sa-4.0",
                  f"checkpoint={root / 'train'}"], root / "export", cache_dir)
    dev = (ROOT / "kotune_data" / "demo" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    texts = [line.split("\t")[1] for line in dev[1:N_REQUESTS + 1]]
    (root / "texts.tsv").write_text("text\n" + "\n".join(texts) + "\n", encoding="utf-8")
    return {"root": root, "export": Path(export["export_dir"]), "texts": texts, "cache": cache_dir, "res": export}


def test_onnx_logits_equal_kotunes_on_the_demo_dev_set_and_int8_agrees(demo):
    import numpy as np

    from heads.onnx import OnnxModel
    from kotune.build import build, make_collator
    from kotune.predict import BatchPredictor, torch_forward

    cfg = compose([*DEMO, f"checkpoint={demo['root'] / 'train'}", f"cache_dir={demo['cache']}"])
    b = build(cfg, ("validation",))
    rows, collator = b.inputs["validation"], make_collator(b.tokenizer, cfg)
    assert len(rows) == 471
    ours = BatchPredictor(torch_forward(b.model), 32, collator).predict(rows).predictions
    fp32 = BatchPredictor(OnnxModel(str(demo["export"]), "model.onnx"), 32, collator).predict(rows).predictions
    int8 = BatchPredictor(OnnxModel(str(demo["export"])), 32, collator).predict(rows).predictions
    assert float(np.abs(ours - fp32).max()) <= 1e-4
    labels = ours.argmax(-1)
    assert len(set(labels.tolist())) >= 2  # not an all-majority agreement
    assert (fp32.argmax(-1) == labels).all()
    assert float((int8.argmax(-1) == labels).mean()) >= 0.95
    assert float(np.abs(ours - int8).max()) > 1e-4  # the int8 model is another model, not the fp32 one



def test_the_int8_export_stores_every_matmul_weight_as_int8(demo):
    """The int8 file is what heads/onnx.py's quantize_int8 asks for (signed int8 weights): every
    MatMul or Gemm of the fp32 graph with a constant weight (the encoder's, the pooler's, the
    classifier's) became a MatMulInteger whose weight and weight zero point are INT8 initializers.
    UINT8 weights (QuantType.QUInt8) would also run and agree, so only the types tell them apart.
    (The embeddings' Gather tables are quantized as activations are, UINT8 whatever the weight type.)"""
    import onnx

    def constant_matmuls(model) -> int:
        weights = {t.name for t in model.graph.initializer}
        return sum(1 for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights)

    fp32 = onnx.load(str(demo["export"] / "model.onnx"))
    int8 = onnx.load(str(demo["export"] / "model_int8.onnx"))
    initializers = {t.name: t for t in int8.graph.initializer}
    integer = [n for n in int8.graph.node if n.op_type == "MatMulInteger"]
    assert constant_matmuls(fp32) >= 14 and len(integer) == constant_matmuls(fp32) and constant_matmuls(int8) == 0
    for node in integer:  # inputs: A (the activation, quantized at run time), B (the weight), A's and B's zero points
        weight, zero_point = initializers[node.input[1]], initializers[node.input[3]]
        types = (onnx.TensorProto.DataType.Name(weight.data_type), onnx.TensorProto.DataType.Name(zero_point.data_type))
        assert types == ("INT8", "INT8"), f"{node.name}: weight {weight.name} and its zero point are {types}"


def test_eval_and_predict_from_the_export_equal_the_checkpoints(demo):
    root, export = demo["root"], demo["export"]
    train = json.loads((root / "train" / "results.json").read_text())
    fp32 = job([*DEMO, "action=eval", f"checkpoint={export}", "onnx.file=model.onnx"], root / "eval-fp32", demo["cache"])
    assert fp32["metrics"] == pytest.approx(train["metrics"], abs=1e-9) and fp32["onnx_file"] == "model.onnx"
    assert [r["prediction"] for r in records(root / "eval-fp32")] == [r["prediction"] for r in records(root / "train")]
    int8 = job([*DEMO, "action=eval", f"checkpoint={export}"], root / "eval-int8", demo["cache"])
    assert int8["onnx_file"] == "model_int8.onnx"
    agree = [a["prediction"] == b["prediction"] for a, b in zip(records(root / "eval-int8"), records(root / "train"))]
    assert len(agree) == 471 and sum(agree) >= 0.95 * 471


def test_an_export_is_refused_in_one_line_where_a_checkpoint_is_needed(demo):
    from kotune.job import execute

    res = execute(compose([*DEMO, "action=export", f"checkpoint={demo['export']}", f"cache_dir={demo['cache']}"]),
                  str(demo["root"] / "re-export"))
    assert res["status"] == "failed" and "is an ONNX export" in res["error"] and "\n" not in res["error"]


def test_the_model_card_is_what_the_hub_reads(demo):
    from huggingface_hub import ModelCard

    card = ModelCard.load(demo["export"] / "README.md")
    data = card.data.to_dict()
    train = json.loads((demo["root"] / "train" / "results.json").read_text())
    assert data["language"] == "ko" and data["license"] == "cc-by-sa-4.0" and data["library_name"] == "onnx"
    assert {"kotune", "text_cls", "onnx", "int8"} <= set(data["tags"]) and data["pipeline_tag"] == "text-classification"
    assert set(data["metrics"]) == set(train["metrics"])
    scores = {m["type"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}
    assert scores == pytest.approx(train["metrics"])
    for label in train["config"]["task"]["labels"] or ["hate", "none", "offensive"]:
        assert f"| {label} |" in card.text
    assert train["data"]["train"]["sha256"] in card.text and train["versions"]["kotune"] in card.text
    assert "max_train_samples: 1000" in card.text  # the resolved training config
    # what push_to_hub would upload: the card, the model files, the tokenizer, kotune's spec
    files = {p.name for p in demo["export"].iterdir()}
    assert {"README.md", "model.onnx", "model_int8.onnx", "config.json", "tokenizer.json", "kotune_export.json"} <= files


def test_push_to_hub_offline_keeps_the_export_and_says_so_in_one_line(demo, monkeypatch):
    import kotune.model_card as model_card
    from tasks.errors import ConfigError

    monkeypatch.setattr(model_card, "hub_reachable", lambda: False)
    with pytest.raises(ConfigError) as e:
        model_card.push_to_hub(str(demo["export"]), "someone/kotune-demo")
    assert "unreachable" in str(e.value) and str(demo["export"]) in str(e.value) and "\n" not in str(e.value)
    assert (demo["export"] / "model.onnx").exists()


# ---- a real server -------------------------------------------------------------------------
def start_server(checkpoint: Path, run_dir: Path, port: int, cache_dir: str, extra: list[str]) -> subprocess.Popen:
    args = [sys.executable, str(ROOT / "run.py"), *DEMO, "action=serve", f"checkpoint={checkpoint}", *extra,
            f"serve.port={port}", "serve.max_wait_ms=50", "serve.max_body_bytes=20000", "serve.max_items=100",
            f"cache_dir={cache_dir}", f"hydra.run.dir={run_dir}"]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


async def concurrent_answers(url: str, texts: list[str]) -> list:
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        responses = await asyncio.gather(*(client.post(f"{url}/predict", json={"text": t}) for t in texts))
    assert [r.status_code for r in responses] == [200] * len(texts), [r.text for r in responses if r.status_code != 200]
    return [r.json()["prediction"] for r in responses]


BAD = [  # (what is sent, the status it gets)
    ({"json": {}}, 422),                                        # missing field
    ({"json": {"text": 5}}, 422),                                # wrong type
    ({"json": {"text": "   "}}, 422),                            # empty text
    ({"json": {"text": "a", "text_pair": "b"}}, 422),            # a field this task does not take
    ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 422),
    ({"json": {"text": "가" * 20000}}, 413),                      # body over serve.max_body_bytes
    ({"json": {"inputs": ["가"] * 101}}, 413),                    # over serve.max_items
]


@pytest.mark.parametrize("served", ["checkpoint", "onnx"])
def test_the_server_answers_64_concurrent_requests_as_predict_does(demo, served):
    import httpx

    root = demo["root"]
    model = root / "train" if served == "checkpoint" else demo["export"]
    # fp32: int8's dynamic quantization scales activations by each batch's range, so its answers
    # depend on which requests share a batch (the bench measures its agreement)
    extra = [] if served == "checkpoint" else ["onnx.file=model.onnx"]
    predicted = job([*DEMO, "action=predict", f"checkpoint={model}", *extra, f"data.predict_file={root / 'texts.tsv'}",
                     "data.text_column=text"], root / f"predict-{served}", demo["cache"])
    expected = [r["prediction"] for r in records(Path(predicted["run_dir"]))]
    assert len(expected) == N_REQUESTS and len(set(expected)) >= 2

    from bench.serve_speed import free_port, stop_server, wait_for_health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(model, root / f"serve-{served}", port, demo["cache"], extra)
    try:
        health = wait_for_health(proc, url, timeout_s=180)
        with httpx.Client(timeout=60) as client:
            assert health["status"] == "ok" and health["runtime"] == ("torch" if served == "checkpoint" else "onnxruntime")
            assert asyncio.run(concurrent_answers(url, demo["texts"])) == expected
            stats = client.get(f"{url}/health").json()
            assert stats["requests"] == N_REQUESTS and stats["texts"] == N_REQUESTS
            assert 1 < stats["largest_batch"] <= 32 and stats["batches"] < N_REQUESTS  # requests were batched
            for sent, status in BAD:
                r = client.post(f"{url}/predict", **sent)
                assert r.status_code == status, (sent, r.text)
                assert isinstance(r.json()["error"], str) and "\n" not in r.json()["error"]
            listed = client.post(f"{url}/predict", json={"inputs": demo["texts"][:5]})
            assert [p["prediction"] for p in listed.json()["predictions"]] == expected[:5]
    finally:
        stop_server(proc)
    results = json.loads((root / f"serve-{served}" / "results.json").read_text())
    assert results["status"] == "ok" and results["serve"]["requests"] == N_REQUESTS + 1
    assert results["serve"]["stopped_by"] == ["SIGTERM"]
