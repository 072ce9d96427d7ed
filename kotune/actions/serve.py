"""``action=serve checkpoint=RUN_OR_EXPORT``: an HTTP JSON endpoint (FastAPI on uvicorn) for a
kotune checkpoint or an ONNX export: ``POST /predict`` answers as ``action=predict`` does,
``GET /health`` says what is served and how it has batched (kotune/serving/app.py). Runs until
interrupted (Ctrl-C, SIGTERM); results.json then holds the serving counts."""
from __future__ import annotations

import os
import signal

from omegaconf import DictConfig

from kotune.core.errors import ConfigError
from kotune.core.log import log, warn


def positive(cfg: DictConfig, key: str, kind=int, allow_zero: bool = False):
    value = cfg.serve.get(key)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"serve.{key} must be a {'non-negative' if allow_zero else 'positive'} number, got {value}")
    return number


def warn_if_descriptors_run_out_first(max_connections: int, reserve: int = 64) -> None:
    """A warning when ``ulimit -n`` leaves fewer descriptors than serve.max_connections (and the
    process's own files): past them new connections wait in the kernel's queue, not a 503."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no rlimits (Windows)
        return
    if soft != resource.RLIM_INFINITY and max_connections + reserve > soft:
        warn(f"serve.max_connections={max_connections}, but this process may open {soft} files (ulimit -n): "
             f"past about {max(soft - reserve, 0)} connections new ones wait instead of getting 503; "
             "raise ulimit -n or lower serve.max_connections")


def budget_note(predictor) -> str:
    """The log's word on ``predict.batch_tokens`` (a joined batch's and a model call's rows × padded
    length); a warning when one text of max_length tokens alone is over it (it then runs alone, past
    the budget)."""
    budget = predictor.batches.batch_tokens
    if not budget:
        return ""
    max_length = int(predictor.b.settings.max_length)
    if budget < max_length:
        warn(f"predict.batch_tokens={budget} is under max_length={max_length}: a text longer than the budget "
             "runs alone in a model call past it; set it to max_length or more")
    return (f", requests joined while their tokens fit predict.batch_tokens={budget} (rows × padded length), "
            "a longer one split over calls within it")


def run(cfg: DictConfig, run_dir: str) -> dict:
    if not cfg.get("checkpoint"):
        raise ConfigError("action=serve needs checkpoint=RUN_DIR (action=train) or an export directory (action=export)")
    limits = {k: positive(cfg, k, allow_zero=k == "max_wait_ms")
              for k in ("port", "max_batch_size", "max_wait_ms", "max_items", "max_body_bytes", "max_text_chars",
                        "max_connections")}
    seconds = {k: positive(cfg, k, float)
               for k in ("body_timeout_s", "keep_alive_s", "shutdown_grace_s", "header_timeout_s")}
    import datasets

    from kotune.serving.batcher import Batcher
    from kotune.serving.guard import is_loopback, resolve_api_key
    from kotune.serving.app import Predictor, create_app, make_server

    api_key = resolve_api_key(cfg, os.environ)
    if cfg.serve.get("api_key") not in (None, ""):
        cfg.serve.api_key = "***"  # not into results.json's config (Hydra's .hydra/ files still hold an override)
    host, port = str(cfg.serve.host), limits["port"]
    datasets.disable_progress_bars()  # a tokenizing bar per batch is no news
    predictor = Predictor(cfg)
    batcher = Batcher(predictor, limits["max_batch_size"], limits["max_wait_ms"])  # its prepare, compute, finish
    app = create_app(predictor, batcher, limits["max_items"], limits["max_body_bytes"],
                     max_text_chars=limits["max_text_chars"], body_timeout_s=seconds["body_timeout_s"],
                     api_key=api_key, docs=bool(cfg.serve.get("docs")))
    what = predictor.describe()
    if not is_loopback(host):
        warn(f"serve.host={host} is not a loopback address: whoever reaches this machine on port {port} can use the "
             f"model{'' if api_key else ' (no API key: set KOTUNE_API_KEY or serve.api_key)'}; plain HTTP, no TLS")
    log(f"serving {what['task']} ({what['runtime']}{', ' + what['model_file'] if what['model_file'] else ''}) on "
        f"http://{host}:{port}: POST {', '.join(predictor.b.task.serve_paths)}, GET /health; batches of up to {batcher.max_batch} texts, "
        f"{limits['max_wait_ms']} ms wait{budget_note(predictor)}{'; API key required' if api_key else ''} (Ctrl-C stops)")
    warn_if_descriptors_run_out_first(limits["max_connections"])
    server = make_server(app, batcher, host, port, keep_alive_s=seconds["keep_alive_s"],
                         shutdown_grace_s=seconds["shutdown_grace_s"], header_timeout_s=seconds["header_timeout_s"],
                         max_connections=limits["max_connections"], body_timeout_s=seconds["body_timeout_s"],
                         max_body_bytes=limits["max_body_bytes"])
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
    return {"serve": {**what, "host": host, "port": port, **batcher.stats, "stopped_by": stopped_by[:1] or None,
                      "api_key": bool(api_key)},
            "checkpoint": cfg.checkpoint, "metrics": {}}
