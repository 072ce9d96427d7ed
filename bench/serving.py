"""A kotune server started for a benchmark (``action=serve`` in a child process on 127.0.0.1): a free
port, start it, wait for its health answer, time single requests, stop it (bench/serve_speed.py,
bench/distill.py)."""
from __future__ import annotations

import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1]) if len(values) > 1 else values[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(proc: subprocess.Popen, url: str, timeout_s: float = 300) -> dict:
    """``GET /health`` of a server being started, polled until it answers (bounded in time)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited (code {proc.returncode}) before it answered")
        try:
            return httpx.get(f"{url}/health", timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url}/health in {timeout_s} s")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (the server finishes and writes results.json), then a kill if it hangs."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_server(overrides: list[str], run_dir: Path | str) -> tuple[subprocess.Popen, str]:
    """``python run.py action=serve OVERRIDES`` on a free port, answering: the process and its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "action=serve", *overrides, f"serve.port={port}",
                             f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(proc, url)
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def request_latency(url: str, texts: list[str], warmup: int = 3) -> dict:
    """Milliseconds of single ``POST /predict`` requests one after another (one client, the
    server's batches of one), after ``warmup`` requests: p50, p95, mean and n."""
    import httpx

    times = []
    with httpx.Client(timeout=600) as client:
        for i, text in enumerate(texts[:warmup] + texts):
            started = time.perf_counter()
            client.post(f"{url}/predict", json={"text": text}).raise_for_status()
            if i >= warmup:
                times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95),
            "mean_ms": statistics.fmean(times), "n": len(times)}
