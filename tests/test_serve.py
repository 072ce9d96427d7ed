"""From a trained model to answers: the ONNX export on the demo set (logits = kotune's to 1e-4 on
all 471 dev comments, int8 labels agree with fp32, predict/eval from the export = from the
checkpoint), the model card the Hub would read, and ``action=serve`` as a real server process on
127.0.0.1: 64 concurrent requests through a real HTTP client, each answered as ``action=predict``
answered, bad requests refused with a 4xx JSON error while the server goes on serving."""
from __future__ import annotations

import asyncio
import json
import signal
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
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

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

    from kotune.export.onnx import OnnxModel
    from kotune.loading.build import build
    from heads.model.inference import BatchPredictor
    from kotune.inference.model_runtimes import torch_forward

    cfg = compose([*DEMO, f"checkpoint={demo['root'] / 'train'}", f"cache_dir={demo['cache']}"])
    b = build(cfg, ("validation",))
    rows, collator = b.inputs["validation"], b.collator
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
    """The int8 file is what kotune/export/onnx.py's quantize_int8 asks for (signed int8 weights): every
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
    from kotune.cli.job import execute

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
    import kotune.export.model_card as model_card
    from kotune.core.errors import ConfigError

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
    ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
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

    from bench.serving import free_port, stop_server, wait_for_health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the checkpoint's server cuts its model calls at 512 tokens (rows × padded length): answers unchanged
    budget = ["predict.batch_tokens=512"] if served == "checkpoint" else []
    proc = start_server(model, root / f"serve-{served}", port, demo["cache"], extra + budget)
    try:
        health = wait_for_health(proc, url, timeout_s=180)
        with httpx.Client(timeout=60) as client:
            assert health["status"] == "ok" and health["runtime"] == ("torch" if served == "checkpoint" else "onnxruntime")
            assert asyncio.run(concurrent_answers(url, demo["texts"])) == expected
            stats = client.get(f"{url}/health").json()
            assert stats["requests"] == N_REQUESTS and stats["texts"] == N_REQUESTS
            assert 1 < stats["largest_batch"] <= 32 and stats["batches"] < N_REQUESTS  # requests were batched
            assert stats["model_calls"] >= stats["batches"] and stats["largest_call_tokens"] > 0
            if budget:  # requests joined while their tokens fit: the calls' padded tokens, all within it
                assert stats["batch_tokens"] == 512 and stats["largest_call_tokens"] <= 512, stats
                assert 0 < stats["call_tokens"] <= 512 * stats["model_calls"] and stats["closed_on_tokens"] >= 0, stats
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


# ---- one bad item, malformed requests, limits, keys, shutdown ---------------------------------
def test_a_failed_batch_is_run_again_item_by_item_and_fails_only_the_bad_request():
    """The model fails on a batch holding one bad text: each text runs again alone, the 30 good
    requests get their answers, the bad one the error with its index (in its own request)."""
    from kotune.serving.batcher import Batcher
    from kotune.serving.requests import ItemFailed

    calls = []

    def predict(examples):
        calls.append(len(examples))
        if any(ex["text"] == "boom" for ex in examples):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return [{"prediction": ex["text"].upper()} for ex in examples]

    async def main():
        batcher = Batcher(predict, max_batch_size=64, max_wait_ms=200)
        worker = asyncio.create_task(batcher.run())
        good = [batcher.submit([{"text": f"t{i}"}]) for i in range(30)]
        bad = batcher.submit([{"text": "ok"}, {"text": "boom"}])
        answers = await asyncio.gather(*good, bad, return_exceptions=True)
        worker.cancel()
        return batcher, answers

    batcher, answers = asyncio.run(main())
    assert answers[:30] == [[{"prediction": f"T{i}"}] for i in range(30)]
    assert isinstance(answers[30], ItemFailed) and answers[30].index == 1
    assert calls[0] == 32 and batcher.stats["failed_items"] == 1  # one batch, then alone each


def test_items_are_checked_before_they_join_a_batch():
    from kotune.serving.requests import RequestError, request_items

    def refused(body, fields=("text",)):
        with pytest.raises(RequestError) as e:
            request_items(body, fields, 100, 50)
        return e.value.status, e.value.index, str(e.value)

    assert refused({"inputs": ["fine", "a\ud800b"]}) == (422, 1, "item 1: text: a lone surrogate (\\ud800) at "
                                                            "character 1; a character outside the BMP is a "
                                                            "\\ud8xx\\udcxx pair")
    assert refused({"text": "a\x00"})[:2] == (422, 0) and "NUL" in refused({"text": "a\x00"})[2]
    assert refused({"inputs": ["x", "y", "z" * 51]})[:2] == (422, 2)
    assert refused({"sentence": "x"}) == (422, 0, "sentence: not a field; this task takes text")
    assert refused({"text": "x", "sentence": "y"}, ("text", "text_pair"))[2] == \
        "sentence: not a field; this task takes text, text_pair"
    assert refused([1, 2])[0] == 422 and refused({"inputs": []})[0] == 422
    assert request_items({"text": "😀 fine"}, ("text",), 100, 50) == ([{"text": "😀 fine"}], True)


def test_the_api_key_comes_from_the_config_or_the_environment_and_loopback_is_told_apart():
    from kotune.serving.guard import is_loopback, resolve_api_key

    cfg = compose([*DEMO, "action=serve"])
    assert resolve_api_key(cfg, {}) is None and resolve_api_key(cfg, {"KOTUNE_API_KEY": "k"}) == "k"
    assert resolve_api_key(compose([*DEMO, "action=serve", "serve.api_key=c"]), {"KOTUNE_API_KEY": "k"}) == "c"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.0.3") and not is_loopback("example.org")


KEY = "test-key-1"
AUTH = {"authorization": f"Bearer {KEY}"}


def serve_process(checkpoint: Path, run_dir: Path, port: int, cache_dir: str, extra: list[str],
                  env: dict | None = None) -> subprocess.Popen:
    import os

    args = [sys.executable, str(ROOT / "run.py"), *DEMO, "action=serve", f"checkpoint={checkpoint}",
            f"serve.port={port}", f"cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *extra]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def health(url: str, timeout_s: float, proc: subprocess.Popen) -> dict:
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited (code {proc.returncode})"
        try:
            return httpx.get(f"{url}/health", headers=AUTH, timeout=5).raise_for_status().json()
        except httpx.TransportError:
            time.sleep(0.5)
    raise AssertionError(f"no answer from {url}/health in {timeout_s} s")


@pytest.fixture(scope="module")
def guarded(demo):
    """A server with an API key (from the environment), a 1 s body time limit and a 1 s keep-alive."""
    from bench.serving import free_port, stop_server

    port, run_dir = free_port(), demo["root"] / "serve-guarded"
    proc = serve_process(demo["root"] / "train", run_dir, port, demo["cache"],
                         ["serve.body_timeout_s=1", "serve.keep_alive_s=1", "serve.max_wait_ms=100"],
                         env={"KOTUNE_API_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        health(url, 180, proc)
        yield {"url": url, "port": port, "log": run_dir.parent / f"{run_dir.name}.log"}
    finally:
        stop_server(proc)


def is_json_error(r, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    message = r.json()["error"]
    assert isinstance(message, str) and "\n" not in message
    return message


def test_a_lone_surrogate_fails_its_own_request_only(guarded, demo):
    """Issue: one "\\ud800" among 30 concurrent requests made all 31 fail with a 500."""
    import httpx

    async def main():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as client:
            bad = b'{"text": "\\ud800 lone"}'
            sends = [client.post(f"{guarded['url']}/predict", json={"text": t}) for t in demo["texts"][:30]]
            sends.insert(15, client.post(f"{guarded['url']}/predict", content=bad,
                                         headers={"content-type": "application/json"}))
            sends.append(client.post(f"{guarded['url']}/predict", content=b'{"inputs": ["ok", "\\ud800", "a"]}',
                                     headers={"content-type": "application/json"}))
            return await asyncio.gather(*sends)

    responses = asyncio.run(main())
    bad, listed = responses.pop(15), responses.pop()
    assert [r.status_code for r in responses] == [200] * 30, [r.text for r in responses]
    assert "lone surrogate" in is_json_error(bad, 422) and bad.json()["index"] == 0
    assert is_json_error(listed, 422).startswith("item 1: text: a lone surrogate") and listed.json()["index"] == 1


def test_nul_malformed_json_unknown_fields_docs_and_keys_get_json_errors(guarded):
    import httpx

    url = guarded["url"]
    with httpx.Client(timeout=60, headers=AUTH) as client:
        r = client.post(f"{url}/predict", json={"inputs": ["a", "b\u0000c"]})
        assert "NUL" in is_json_error(r, 422) and r.json()["index"] == 1
        r = client.post(f"{url}/predict", content=b'{"text": "a",', headers={"content-type": "application/json"})
        assert is_json_error(r, 400).startswith("body: not JSON")
        r = client.post(f"{url}/predict", content=b'\xff\xfe', headers={"content-type": "application/json"})
        assert is_json_error(r, 400).startswith("body: not JSON")
        assert is_json_error(client.post(f"{url}/predict", json={"sentence": "좋다"}), 422) == \
            "sentence: not a field; this task takes text"
        assert is_json_error(client.post(f"{url}/predict", json={"inputs": [{"text": "a"}, {"sentence": "b"}]}),
                             422) == "item 1: sentence: not a field; this task takes text"
        for path in ("/docs", "/openapi.json", "/redoc", "/nowhere"):
            is_json_error(client.get(f"{url}{path}"), 404)
        is_json_error(client.get(f"{url}/predict"), 405)
    assert "API key" in is_json_error(httpx.post(f"{url}/predict", json={"text": "좋다"}), 401)
    is_json_error(httpx.get(f"{url}/health", headers={"authorization": "Bearer wrong"}), 401)
    is_json_error(httpx.post(f"{url}/predict", json={"text": "좋다"}, headers={"authorization": KEY}), 401)
    assert httpx.post(f"{url}/predict", json={"text": "좋다"}, headers=AUTH).status_code == 200


def test_a_text_past_the_window_is_answered_truncated_and_not_echoed(guarded):
    import httpx

    url = guarded["url"]
    long = "좋은 영화 " * 16_666 + "끝"  # 100,000 characters
    assert len(long) == 99_997
    with httpx.Client(timeout=120, headers=AUTH) as client:
        r = client.post(f"{url}/predict", json={"text": long})
        assert r.status_code == 200 and r.json()["truncated"] is True and "text" not in r.json(), r.text[:300]
        assert len(r.content) < 1000
        r = client.post(f"{url}/predict", json={"inputs": ["짧은 글", long]})
        assert [p["truncated"] for p in r.json()["predictions"]] == [False, True]
        r = client.post(f"{url}/predict", params={"echo": "true"}, json={"text": "짧은 글"})
        assert r.json()["text"] == "짧은 글" and r.json()["truncated"] is False
        r = client.post(f"{url}/predict", json={"inputs": ["a", "가" * 100_001]})
        assert "over serve.max_text_chars=100000" in is_json_error(r, 422) and r.json()["index"] == 1


def raw_request(port: int, head: bytes) -> "socket.socket":
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head)
    return sock


def test_a_body_that_trickles_in_gets_408_and_an_idle_connection_is_closed(guarded):
    import select
    import time

    body = b'{"text": "' + b"a" * 40 + b'"}'
    head = (f"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer {KEY}\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    sock = raw_request(guarded["port"], head)
    started, answer = time.monotonic(), b""
    with sock:
        for byte in body[:-1]:  # a byte every 0.2 s: 10 s in all, the server's limit is 1 s
            if select.select([sock], [], [], 0.2)[0]:
                answer = sock.recv(4096)
                break
            sock.sendall(bytes([byte]))
        while answer and select.select([sock], [], [], 5)[0]:  # the rest, up to the close
            more = sock.recv(4096)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < 5 and b"body_timeout_s" in answer and b"application/json" in answer

    sock = raw_request(guarded["port"], f"GET /health HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\r\n"
                       .encode())
    with sock:
        answer = sock.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length:  # the whole answer: what follows can only be the close
            body += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok"
        started = time.monotonic()
        assert select.select([sock], [], [], 4)[0], "the idle connection was not closed (serve.keep_alive_s=1)"
        assert sock.recv(1) == b"" and time.monotonic() - started < 3


def test_dropped_clients_and_a_shutdown_with_requests_in_flight(demo):
    """Clients that hang up before their turn are not run; SIGTERM with a queue of requests:
    every request gets 200 or a 503 JSON answer, and the log says how many were refused."""
    import time

    import httpx

    from bench.serving import free_port, stop_server

    port, run_dir = free_port(), demo["root"] / "serve-shutdown"
    proc = serve_process(demo["root"] / "train", run_dir, port, demo["cache"],
                         ["serve.max_batch_size=1", "serve.shutdown_grace_s=1", f"serve.api_key={KEY}"])
    url, texts = f"http://127.0.0.1:{port}", (demo["texts"] * 5)[:300]
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)

    async def hang_up():
        async with httpx.AsyncClient(timeout=0.5, headers=AUTH, limits=limits) as client:
            return await asyncio.gather(*(client.post(f"{url}/predict", json={"text": t}) for t in texts),
                                        return_exceptions=True)

    async def shut_down():
        async with httpx.AsyncClient(timeout=60, headers=AUTH, limits=limits) as client:
            sends = asyncio.gather(*(client.post(f"{url}/predict", json={"text": t}) for t in texts),
                                   return_exceptions=True)
            before = (await client.get(f"{url}/health")).json()["requests"]
            for _ in range(600):  # every request is in: answered or waiting
                await asyncio.sleep(0.05)
                now = (await client.get(f"{url}/health")).json()
                if now["requests"] - before + now["in_flight"] >= len(texts):
                    break
            proc.send_signal(signal.SIGTERM)
            return now, await sends

    try:
        health(url, 180, proc)
        asyncio.run(hang_up())
        for _ in range(200):  # the queue empties
            stats = health(url, 10, proc)
            if stats["in_flight"] == 0:
                break
            time.sleep(0.1)
        assert stats["dropped"] >= 1 and stats["requests"] < len(texts), stats
        at_signal, responses = asyncio.run(shut_down())
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            stop_server(proc)
    assert at_signal["in_flight"] > 0, at_signal  # the signal came with a queue
    failures = [r for r in responses if isinstance(r, Exception)]
    assert not failures, failures[:3]
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    refused = [r for r in responses if r.status_code == 503]
    assert all("shutting down" in is_json_error(r, 503) for r in refused)
    log = (run_dir.parent / f"{run_dir.name}.log").read_text()
    assert "answered 503" in log and "Traceback" not in log and "Cancel" not in log, log[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "ok" and results["serve"]["refused"] == len(refused)
    assert results["serve"]["dropped"] == stats["dropped"]  # refused is not dropped
    assert results["config"]["serve"]["api_key"] == "***"


def test_the_request_schema_is_built_from_the_task_fields():
    """POST /predict's OpenAPI schema names the served task's own fields (Task.request_fields), no others."""
    from kotune.serving.requests import request_model

    for fields in (("text",), ("text", "text_pair"), ("question", "context")):
        schema = request_model(fields).model_json_schema()
        assert set(schema["properties"]) == {"inputs", *fields} and schema["additionalProperties"] is False
        assert set(schema["$defs"]["Item"]["properties"]) == set(fields)
