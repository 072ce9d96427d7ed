"""Measuring helpers for the benchmarks: the machine's own matmul peak (the denominator of MFU),
peak memory of one phase, wall time with the accelerator synchronised, and medians."""
from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import threading
import time
from typing import Iterator

import torch

# GEMM shapes of a BERT-base layer at a few thousand tokens (QKV/output, FFN in, FFN out) and a square
# one: the peak is the best any of them reaches, so MFU is measured against what this machine's BLAS
# can do on the model's own shapes, not against a datasheet.
PEAK_SHAPES = ((4096, 768, 768), (4096, 768, 3072), (4096, 3072, 768), (2048, 2048, 2048))


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_peak(dtype: torch.dtype = torch.float32, repeats: int = 5, budget_s: float = 3.0,
                shapes: tuple = PEAK_SHAPES) -> float:
    """Best FLOP/s of a plain matmul over ``shapes`` (best of ``repeats`` each)."""
    dev = device()
    best = 0.0
    deadline = time.perf_counter() + budget_s
    for m, k, n in shapes:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        a @ b  # warm-up: thread pool, kernel choice
        sync()
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            sync()
            best = max(best, 2.0 * m * k * n / (time.perf_counter() - start))
            if time.perf_counter() > deadline:
                break
    return best


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc), so the next phase's RSS starts low."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory a phase adds: CUDA's allocator peak, or on CPU the resident set sampled every
    few milliseconds above its level at the start (freed heap returned to the OS first)."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.peak_bytes = 0

    def __enter__(self) -> "PeakMemory":
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        _release_free_heap()
        self._base = _rss_bytes()
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_bytes())
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            return
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(0, max(self._peak, _rss_bytes()) - self._base)


@contextlib.contextmanager
def timed() -> Iterator[dict]:
    """``with timed() as t: ...`` then ``t["s"]``: wall seconds, accelerator work included."""
    out: dict = {}
    sync()
    start = time.perf_counter()
    try:
        yield out
    finally:
        sync()
        out["s"] = time.perf_counter() - start


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


SMOKE_HELP = ("tiny settings that still take every code path of the real run (its phases, closing table and "
              "RESULT line) in seconds, writing under a temporary --out; tests/test_bench_smoke.py runs it")


def parse_with_smoke(parser, smoke: dict, argv: list[str] | None = None):
    """``parser``'s arguments with ``--smoke`` added: with it, ``smoke``'s values replace the defaults
    (an option given explicitly still wins)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args


def add_mini_shape_arguments(parser, vocab: int) -> None:
    """The mini encoder's shape as options (``--hidden``, ``--layers``, ``--vocab``, ``--block``,
    ``--batch``): the RTD benches' (bench/rtd_diagnostics.py, bench/rtd_sample_speed.py)."""
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=vocab)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
