"""``action=serve``'s app: the FastAPI app (``POST /predict``, ``GET /health``) in front of the
:class:`Predictor` (kotune/serving/predictor.py: inputs → the records action=predict writes), with its
micro-batcher (kotune/serving/batcher.py: batches of up to ``serve.max_batch_size`` texts, the first
waiting at most ``serve.max_wait_ms``, requests joined while their tokens fit ``predict.batch_tokens``
and each model call within it; the next batch tokenized while the model runs the current one), its
request checks (kotune/serving/requests.py) and the ASGI guard in front of it (kotune/serving/guard.py:
API key, body size and time limits, a JSON answer for every error).

A request is one input, ``{"text": "..."}`` (``text_pair`` for pair tasks, ``question`` and
``context`` for QA), or a list of them: ``{"inputs": [{...}, ...]}`` (for single-text tasks plain
strings do: ``{"inputs": ["...", "..."]}``). The answer is the predictions.jsonl record without its
id and without the input texts (``?echo=true`` keeps them): ``{"prediction": ...}``, or
``{"predictions": [...]}`` for a list; with ``"truncated": true`` where a text did not fit the
model's window (``"windows": n`` when the checkpoint reads documents as windows), and
``"abstained"`` with ``predict.min_confidence`` (kotune/calibration/abstention.py).

Every item is checked before it joins a batch (a lone surrogate, a NUL, a text over
``serve.max_text_chars``: 422 naming the item and its ``index``), and a batch that fails is retried
one item at a time, so that only the request holding the bad item fails. Every error is JSON
``{"error": "one line", ...}``: 400 malformed JSON (or nested too deeply), 401 no or wrong API key,
404/405, 408 a body slower than ``serve.body_timeout_s``, 413 too large, 422 a bad input, 500 with
an ``id`` the log repeats, 503 shutting down or over ``serve.max_connections``. Work for a client
that has disconnected is dropped."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

from kotune.serving.batcher import Batcher
from kotune.serving.guard import guard
from kotune.serving.predictor import Predictor, servable  # noqa: F401 - imported from here by callers
from kotune.serving.requests import (ItemFailed, RequestError, ShuttingDown, data_error, error_body,
                                   error_id, request_items, request_model)
from kotune.core.errors import DataError
from kotune.core.log import log, logger, warn


# ---- the app --------------------------------------------------------------------------------
async def answer_or_disconnect(future: asyncio.Future, receive) -> list[dict] | None:
    """The future's result, or None when the client disconnects first (the future is then
    cancelled: the batcher skips it if its batch has not run)."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            return future.result()
        return None
    finally:
        watcher.cancel()
        future.cancel()


def json_error(status: int, message: str, headers: dict | None = None, **extra):
    """A one-line JSON error answer: ``{"error": "...", ...extra}``."""
    from fastapi.responses import Response

    return Response(error_body(message, **extra), status_code=status, headers=headers, media_type="application/json")


def add_error_handlers(app) -> None:
    """Every error as a one-line JSON answer: a request the schema refuses (422), an HTTP error, and a
    bug (500 with an id that the log repeats beside its traceback)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return json_error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return json_error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        eid = error_id()
        logger.error(f"error [{eid}]: {request.method} {request.url.path}: {type(exc).__name__}: {exc}", exc_info=exc)
        return json_error(500, f"internal error {eid}: {type(exc).__name__}", id=eid)


async def answer(request, predictor, batcher: Batcher, max_items: int, max_text_chars: int, echo: bool):
    """``POST /predict``: the body read and checked by hand (one line per mistake, naming the item), its
    examples queued on the batcher, the records (or the item's error) once its batch has run."""
    from fastapi.responses import Response
    from starlette.requests import ClientDisconnect

    try:
        raw = await request.body()
    except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to log
        return Response(status_code=499)
    try:
        body = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        return json_error(400, f"body: not JSON ({getattr(e, 'msg', type(e).__name__)}"
                               f"{f' at character {e.pos}' if getattr(e, 'pos', None) is not None else ''})")
    except RecursionError:  # [[[[...: the parser's stack, not the server, gives out; the client's mistake
        return json_error(400, "body: JSON nested too deeply")
    single = True
    try:
        items, single = request_items(body, predictor.fields, max_items, max_text_chars)
        try:
            examples = predictor.examples(items)
        except DataError as e:
            raise data_error(e, single) from None
        try:
            future = batcher.enqueue(examples)
        except ShuttingDown:
            batcher.stats["refused"] += 1
            raise RequestError(503, "the server is shutting down; retry", headers={"connection": "close"}) from None
        try:
            records = await answer_or_disconnect(future, request.receive)
        except ShuttingDown:
            raise RequestError(503, "the server is shutting down; retry", headers={"connection": "close"}) from None
        except ItemFailed as e:
            if isinstance(e.error, DataError):
                raise data_error(e.error, single) from None
            raise RequestError(500, f"{'' if single else f'item {e.index}: '}internal error {e.id}: "
                                    f"{type(e.error).__name__}", e.index, id=e.id) from None
    except RequestError as e:
        return json_error(e.status, str(e), e.headers, index=e.index, id=e.id)
    if records is None:  # the client is gone: nobody reads this
        return Response(status_code=499)
    if not echo:
        records = [{k: v for k, v in r.items() if k not in predictor.fields} for r in records]  # ?echo=true keeps them
    return records[0] if single else {"predictions": records}


def create_app(predictor, batcher: Batcher, max_items: int, max_body_bytes: int, *, max_text_chars: int = 100_000,
               body_timeout_s: float = 10.0, api_key: str | None = None, docs: bool = False):
    from fastapi import FastAPI, Request

    @asynccontextmanager
    async def lifespan(app):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        batcher.close()

    app = FastAPI(title="kotune", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)
    add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "shutting down" if batcher.closing else "ok", **predictor.describe(),
                "max_batch_size": batcher.max_batch, "max_wait_ms": batcher.max_wait * 1000, **batcher.stats,
                "in_flight": len(batcher.waiting)}

    async def predict(request, echo: bool = False):
        return await answer(request, predictor, batcher, max_items, max_text_chars, echo)

    predict.__annotations__.update(request=Request, echo=bool)  # the body is read and checked in answer(), by hand
    for path in predictor.b.task.serve_paths:  # /predict; a bi-encoder's /embed too (Task.serve_paths)
        app.post(path, openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": request_model(predictor.fields).model_json_schema()}}}})(predict)

    return guard(app, max_body_bytes, body_timeout_s, api_key)


def make_server(app, batcher: Batcher, host: str, port: int, *, keep_alive_s: float = 5.0,
                shutdown_grace_s: float = 5.0, header_timeout_s: float = 5.0, max_connections: int = 512,
                body_timeout_s: float = 10.0, max_body_bytes: int = 1_000_000):
    """A uvicorn server whose shutdown answers every request in flight: new ones get 503 at once,
    those already queued are run while the grace period lasts (less a margin to send the answers),
    then the rest get a 503 JSON answer; the log says how many of each. Its connections have a head
    time limit, a cap and a lingering close, and running out of descriptors is a warning
    (kotune/serving/connections.py); their counts join ``batcher.stats``."""
    import uvicorn

    from kotune.serving.connections import ConnectionLimits, accept_error_handler, protocol_class

    limits = ConnectionLimits(header_timeout_s, max_connections, linger_s=body_timeout_s,
                              linger_bytes=max(16 * max_body_bytes, 1 << 20), stats=batcher.stats)

    drain_s = max(shutdown_grace_s - 1.0, shutdown_grace_s / 2)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            asyncio.get_running_loop().set_exception_handler(accept_error_handler(limits))
            await super().startup(sockets)

        async def shutdown(self, sockets=None):
            batcher.closing = True
            if batcher.waiting:
                log(f"shutting down: {len(batcher.waiting)} requests in flight, run for up to {drain_s:g} s "
                    f"(serve.shutdown_grace_s={shutdown_grace_s:g}); new ones get 503")

            def refuse() -> None:
                refused = batcher.refuse_all()
                if refused:
                    warn(f"shutdown: {refused} requests still in flight after {drain_s:g} s answered 503 "
                         f"(serve.shutdown_grace_s={shutdown_grace_s:g})")

            timer = asyncio.get_running_loop().call_later(drain_s, refuse)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    # log_config=None: uvicorn's own (logging.config.dictConfig) would close the handlers already
    # set up, run.log's among them, which then reopens it at its next line: out of descriptors, that
    # line raised out of the event loop and ended the server
    return Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, log_config=None,
                                 http=protocol_class(limits), ws="none", timeout_keep_alive=keep_alive_s,
                                 timeout_graceful_shutdown=shutdown_grace_s))

