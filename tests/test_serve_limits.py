"""``action=serve`` under abuse, as a real server process on 127.0.0.1 (issue 52): sockets that send
nothing or a head byte by byte are closed after ``serve.header_timeout_s``; more connections than
``ulimit -n`` allows make a warning, not an exit; past ``serve.max_connections`` a connection gets a
503 JSON answer; a body over ``serve.max_body_bytes`` gets its 413 read by a client that sends it
whole; JSON nested 100,000 deep is a 400. And the API key check (issue 53) called directly with
keys that nearly match. Every loop is bounded in count and time."""
from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, compose

DEMO = ["task=text_cls", "model=tiny", "data=demo"]
NOFILE = 256  # the server's ulimit -n in the descriptor test


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, cache_dir) -> Path:
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    run_dir = tmp_path_factory.mktemp("serve-limits") / "train"
    res = execute(compose([*DEMO, "data.max_train_samples=64", "train.max_steps=2", f"cache_dir={cache_dir}"]),
                  str(run_dir))
    assert res["status"] == "ok", res.get("error")
    return run_dir


def start(checkpoint: Path, name: str, cache_dir: str, extra: list[str], nofile: int | None = None) -> dict:
    """``python run.py action=serve`` on a free port (with ``ulimit -n nofile``), once it answers /health."""
    from bench.serving import free_port, stop_server, wait_for_health

    def limit_descriptors() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    port, run_dir = free_port(), checkpoint.parent / name
    log = run_dir.parent / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *DEMO, "action=serve", f"checkpoint={checkpoint}",
                                 f"serve.port={port}", f"cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *extra],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=limit_descriptors if nofile else None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(proc, url, timeout_s=120)
    except BaseException:
        stop_server(proc)
        raise
    return {"proc": proc, "url": url, "port": port, "run_dir": run_dir, "log": log}


@pytest.fixture(scope="module")
def limited(checkpoint, cache_dir):
    """A server that may open 256 files, with the default serve.max_connections (more), 1 s to send a
    request's head, a 300,000-byte body limit."""
    from bench.serving import stop_server

    pytest.importorskip("resource")
    server = start(checkpoint, "serve-limited", cache_dir, ["serve.header_timeout_s=1", "serve.keep_alive_s=1",
                                                           "serve.max_body_bytes=300000"], nofile=NOFILE)
    try:
        yield server
    finally:
        stop_server(server["proc"])


def get_health(url: str, timeout_s: float = 10) -> dict:
    import httpx

    r = httpx.get(f"{url}/health", timeout=timeout_s)
    assert r.status_code == 200, r.text
    return r.json()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (EOF or a reset) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                if sock.recv(4096) == b"":
                    return True
            except OSError:
                return True
    return False


def test_a_silent_socket_and_a_head_sent_byte_by_byte_are_closed(limited):
    """Issue: no timeout before the first request: idle sockets and slow heads were held forever."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", limited["port"]), timeout=10) as idle:
        assert closed_within(idle, 4), "a socket that sent nothing was not closed (serve.header_timeout_s=1)"
    assert time.monotonic() - started < 4
    with socket.create_connection(("127.0.0.1", limited["port"]), timeout=10) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        closed, started = False, time.monotonic()
        for _ in range(40):  # a header line every 0.1 s: 4 s in all, the head's limit is 1 s
            if select.select([slow], [], [], 0.1)[0]:
                closed = closed_within(slow, 1)
                break
            try:
                slow.sendall(b"x-slow: 1\r\n")
            except OSError:  # closed (a reset) while sending
                closed = True
                break
        assert closed and time.monotonic() - started < 3.5, "a head sent line by line was not closed"
    assert get_health(limited["url"])["header_timeouts"] >= 2


def test_more_sockets_than_descriptors_make_a_warning_not_an_exit(limited):
    """Issue: with ulimit -n 1024, 1,030 idle sockets made the server exit (OSError: Too many open files)."""
    import httpx

    socks = []
    try:
        for _ in range(NOFILE + 150):
            socks.append(socket.create_connection(("127.0.0.1", limited["port"]), timeout=10))
        # the kernel queues what the server cannot accept; the head limit frees descriptors each second
        r = httpx.get(f"{limited['url']}/health", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert limited["proc"].poll() is None, "the server exited"
    finally:
        for sock in socks:
            sock.close()
    assert get_health(limited["url"])["status"] == "ok"
    log = limited["log"].read_text()
    assert "Too many open files" in log and "warning: accepting a connection" in log, log[-2000:]
    assert "serve.max_connections=512, but this process may open 256 files" in log
    assert "Traceback" not in log, log[-3000:]


def read_answer(sock: socket.socket, timeout_s: float = 10) -> bytes:
    """Everything the server sends until it closes (bounded in time)."""
    answer, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline and select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_a_client_sending_a_1_mb_body_whole_reads_its_413(limited):
    """Issue: the 413 was sent, then the connection reset while the client still sent (5 of 5)."""
    body = b'{"text": "' + b"a" * 1_000_000 + b'"}'
    head = (f"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    answers = []
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", limited["port"]), timeout=10) as sock:
            try:
                sock.sendall(head)
                sock.sendall(body)
                answers.append(read_answer(sock))
            except OSError as e:
                answers.append(repr(e).encode())
    assert all(a.startswith(b"HTTP/1.1 413") for a in answers), [a[:80] for a in answers]
    _, _, text = answers[0].partition(b"\r\n\r\n")
    assert json.loads(text) == {"error": "request body over serve.max_body_bytes=300000"}


def test_json_nested_100000_deep_is_a_400(limited):
    """Issue: a RecursionError in the parser answered 500."""
    import httpx

    for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        r = httpx.post(f"{limited['url']}/predict", content=deep, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 400 and r.json() == {"error": "body: JSON nested too deeply"}, r.text[:300]
    assert httpx.post(f"{limited['url']}/predict", json={"text": "좋다"}, timeout=30).status_code == 200


def test_past_max_connections_a_connection_gets_a_503_and_the_server_goes_on():
    """uvicorn's own limit answers requests only: idle connections held every slot without one. The
    server of action=serve (make_server) in this process, in front of an app that answers {}."""
    import threading

    import httpx

    from bench.serving import free_port
    from kotune.serving.app import make_server
    from kotune.serving.batcher import Batcher

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b"{}"})

    batcher, port = Batcher(lambda examples: examples, 1, 0), free_port()
    server = make_server(app, batcher, "127.0.0.1", port, max_connections=20, header_timeout_s=30)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):  # started (bounded)
            if server.started:
                break
            time.sleep(0.05)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        try:
            time.sleep(0.3)  # every one accepted
            r = httpx.get(url, timeout=10)
            assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
            assert r.json() == {"error": "too many connections (serve.max_connections=20); retry"}
            assert r.headers["retry-after"] == "1" and batcher.stats["shed_connections"] == 1
        finally:
            for sock in socks:
                sock.close()
        for _ in range(50):  # the server notices the closes
            r = httpx.get(url, timeout=10)
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json() == {}
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()


# ---- the API key check, called directly (issue 53) --------------------------------------------
KEY = "s3cret-KEY"


def status_for(authorization: bytes | None) -> int:
    """The status the guard answers a request with this Authorization header (None: none)."""
    from kotune.serving.guard import guard

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [] if authorization is None else [(b"authorization", authorization)]
    scope = {"type": "http", "method": "GET", "path": "/health", "headers": headers}
    asyncio.run(guard(app, 1000, 5.0, KEY)(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize("given", [
    None, b"", b"Bearer", b"Bearer ", b"Bearer s3cret-KEYx", b"Bearer s3cret-KEY-extra", b"Bearer s3cret-KE",
    b"Bearer s", b"Bearer xs3cret-KEY", b"Bearer 3cret-KEY", b"Bearer s3cret-key", b"Bearer S3CRET-KEY",
    b"s3cret-KEY", b"Basic s3cret-KEY", b"Bearers3cret-KEY", b"Token s3cret-KEY", b"Bearer s3cret-KEY s3cret-KEY",
    b"Bearer \xc3\xa9s3cret-KEY",
])
def test_a_key_that_nearly_matches_is_refused(given):
    assert status_for(given) == 401


@pytest.mark.parametrize("given", [b"Bearer s3cret-KEY", b"bearer s3cret-KEY", b"BEARER s3cret-KEY"])
def test_the_key_itself_is_let_through_whatever_the_schemes_case(given):
    assert status_for(given) == 200  # RFC 7235: the scheme's case does not matter, the token's does


def test_the_key_is_compared_in_constant_time(monkeypatch):
    import hmac

    from kotune.serving import guard

    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(guard.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert status_for(b"Bearer s3cret-KEX") == 401 and calls == [(b"s3cret-KEX", KEY.encode())]
