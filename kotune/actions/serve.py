"""``action=serve checkpoint=RUN_OR_EXPORT``: an HTTP JSON endpoint (FastAPI on uvicorn) for a
kotune checkpoint or an ONNX export: ``POST /predict`` answers as ``action=predict`` does,
``GET /health`` says what is served and how it has batched (kotune/serving.py). Runs until
interrupted (Ctrl-C, SIGTERM); results.json then holds the serving counts."""
from __future__ import annotations

import signal

from omegaconf import DictConfig

from tasks.errors import ConfigError
from tasks.log import log


def positive(cfg: DictConfig, key: str) -> int:
    value = cfg.serve.get(key)
    if value is None or int(value) < (0 if key == "max_wait_ms" else 1):
        raise ConfigError(f"serve.{key} must be a {'non-negative' if key == 'max_wait_ms' else 'positive'} number, "
                          f"got {value}")
    return int(value)


def run(cfg: DictConfig, run_dir: str) -> dict:
    if not cfg.get("checkpoint"):
        raise ConfigError("action=serve needs checkpoint=RUN_DIR (action=train) or an export directory (action=export)")
    limits = {k: positive(cfg, k) for k in ("port", "max_batch_size", "max_wait_ms", "max_items", "max_body_bytes")}
    import datasets
    import uvicorn

    from kotune.serving import Batcher, Predictor, create_app

    datasets.disable_progress_bars()  # a tokenizing bar per batch is no news
    predictor = Predictor(cfg)
    batcher = Batcher(predictor, limits["max_batch_size"], limits["max_wait_ms"])
    app = create_app(predictor, batcher, limits["max_items"], limits["max_body_bytes"])
    host, port = str(cfg.serve.host), limits["port"]
    what = predictor.describe()
    log(f"serving {what['task']} ({what['runtime']}{', ' + what['model_file'] if what['model_file'] else ''}) on "
        f"http://{host}:{port}: POST /predict, GET /health; batches of up to {batcher.max_batch} texts, "
        f"{limits['max_wait_ms']} ms wait (Ctrl-C stops)")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5))
    stopped_by: list[str] = []
    # uvicorn stops on SIGINT/SIGTERM and then re-sends the signal to the handlers it found: these
    # note it instead of ending the process, so that results.json is still written
    previous = {sig: signal.signal(sig, lambda number, frame: stopped_by.append(signal.Signals(number).name))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot listen
        raise ConfigError(f"serve.port={port}: cannot listen on {host}:{port} (in use, or not an address here)") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log(f"stopped ({', '.join(stopped_by) or 'shut down'}) after {batcher.stats['requests']} requests in "
        f"{batcher.stats['batches']} batches")
    return {"serve": {**what, "host": host, "port": port, **batcher.stats, "stopped_by": stopped_by[:1] or None},
            "checkpoint": cfg.checkpoint, "metrics": {}}
