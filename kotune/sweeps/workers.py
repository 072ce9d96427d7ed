"""``hparams_search.n_jobs``: one sweep command starting N workers of itself on one study, each
pinned to its own GPU where there are GPUs."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

log = logging.getLogger(__name__)
WORKER_ENV = "KOTUNE_WORKER"  # "i/N": this process is worker i of the N that hparams_search.n_jobs started


def visible_gpus() -> int:
    """The GPUs this process may use (``hparams_search.n_jobs=auto``), without importing torch."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch / no driver: no GPUs
        return 0


def n_workers(n_jobs: int | str) -> int:
    """``hparams_search.n_jobs``: a number, or ``auto`` (one per visible GPU, at least one)."""
    if str(n_jobs).strip().lower() == "auto":
        return max(1, visible_gpus())
    return max(1, int(n_jobs))


def command_line() -> list[str]:
    """This process's command, to start it again as a worker (``python run.py …`` or ``kotune …``)."""
    first = sys.argv[0]
    if first.endswith(".py") or not os.access(first, os.X_OK):
        script = first if os.path.exists(first) else os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "run.py")
        return [sys.executable, script, *sys.argv[1:]]
    return [first, *sys.argv[1:]]


def run_workers(n: int) -> None:
    """``n`` copies of this sweep command with ``n_jobs=1``, at once, on the same study: each pulls
    trials until the study has its n_trials. With GPUs, worker i sees only GPU i."""
    gpus = visible_gpus()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    procs = []
    for i in range(n):
        env = dict(os.environ, **{WORKER_ENV: f"{i}/{n}"})
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible[i % gpus] if visible else str(i % gpus)
        args = [a for a in command_line() if not a.startswith(("hparams_search.n_jobs=", "hydra.sweeper.n_jobs="))]
        procs.append(subprocess.Popen([*args, "hparams_search.n_jobs=1"], env=env))
    log.info(f"{n} workers on the study: pids {' '.join(str(p.pid) for p in procs)}")
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:  # Ctrl-C: the workers' trials are told failed on their way out
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    if any(codes):
        raise RuntimeError(f"sweep workers exited with {codes} (their output is above)")
