"""``action=serve``'s pieces: the :class:`Predictor` (inputs → the records action=predict writes,
through the same encoding, length-sorted batches, decoding and records), the :class:`Batcher`
(concurrent requests joined into batches of up to ``serve.max_batch_size`` texts, the first
waiting at most ``serve.max_wait_ms``), the FastAPI app (``POST /predict``, ``GET /health``) and
the ASGI guard in front of it (API key, body size and time limits, a JSON answer for every error).

A request is one input, ``{"text": "..."}`` (``text_pair`` for pair tasks, ``question`` and
``context`` for QA), or a list of them: ``{"inputs": [{...}, ...]}`` (for single-text tasks plain
strings do: ``{"inputs": ["...", "..."]}``). The answer is the predictions.jsonl record without its
id and without the input texts (``?echo=true`` keeps them): ``{"prediction": ...}``, or
``{"predictions": [...]}`` for a list; with ``"truncated": true`` where a text did not fit the
model's window (``"windows": n`` when the checkpoint reads documents as windows).

Every item is checked before it joins a batch (a lone surrogate, a NUL, a text over
``serve.max_text_chars``: 422 naming the item and its ``index``), and a batch that fails is retried
one item at a time, so that only the request holding the bad item fails. Every error is JSON
``{"error": "one line", ...}``: 400 malformed JSON, 401 no or wrong API key, 404/405, 408 a body
slower than ``serve.body_timeout_s``, 413 too large, 422 a bad input, 500 with an ``id`` the log
repeats, 503 shutting down. Work for a client that has disconnected is dropped."""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from omegaconf import DictConfig
from pydantic import BaseModel, ConfigDict, StrictStr

from kotune.build import build, make_collator
from kotune.predict import BatchPredictor, predict_rows, torch_forward
from tasks import build_task
from tasks.errors import ConfigError, DataError
from tasks.log import log, logger, warn

API_KEY_ENV = "KOTUNE_API_KEY"
ECHOED = ("text", "text_pair", "question", "context")  # the inputs a record repeats; left out unless ?echo=true


def servable(task) -> None:
    """A one-line refusal for a task whose input is more than plain text."""
    if task.request_fields is None:
        raise ConfigError(f"action=serve: task {task.name} reads more than plain text (its files mark entities "
                          "or words with their annotations); predict a file with action=predict")


class Predictor:
    """The model of ``checkpoint=`` (a kotune checkpoint or an ONNX export) behind a call from
    examples to records."""

    def __init__(self, cfg: DictConfig):
        servable(build_task(cfg.task))
        self.b = build(cfg, (), onnx=True)
        servable(self.b.task)
        onnx = getattr(self.b.model, "runtime", None) == "onnxruntime"
        self.runtime = "onnxruntime" if onnx else "torch"
        forward = self.b.model if onnx else torch_forward(self.b.model)
        self.batches = BatchPredictor(forward, int(cfg.train.eval_batch_size), make_collator(self.b.tokenizer, cfg))

    @property
    def fields(self) -> tuple[str, ...]:
        return self.b.task.request_fields

    def examples(self, items: list[dict[str, str]]) -> list[dict]:
        return self.b.task.request_examples(items)

    def __call__(self, examples: list[dict], lengths: bool = False) -> list[dict]:
        """The records action=predict writes for ``examples``, without their ids; ``lengths``: with
        how each text's length was handled (:meth:`lengths`), as the server answers."""
        task = self.b.task
        features = task.encode(examples, self.b.tokenizer, self.b.settings)
        inputs = features.select_columns(task.model_columns(features))
        outputs, _ = predict_rows(self.batches, task, features, inputs, examples)
        records = [{k: v for k, v in r.items() if k != "id"} for r in task.prediction_records(outputs, examples)]
        if lengths:
            for record, note in zip(records, self.lengths(features, examples)):
                record.update(note)
        return records

    def answer(self, examples: list[dict]) -> list[dict]:
        """The server's answers: the records with ``truncated`` (or ``windows``)."""
        return self(examples, lengths=True)

    def lengths(self, features, examples: list[dict]) -> list[dict]:
        """Per example, how its length was handled: ``{"windows": n}`` where the checkpoint reads
        documents as windows (task.long_text=windows), else ``{"truncated": bool}``: whether its
        tokens went past the model's window (max_length); nothing for QA (contexts are windowed)."""
        task, n = self.b.task, len(examples)
        if "context" in self.fields or len(features) != n or "input_ids" not in features.column_names:
            return [{}] * n
        ids = features["input_ids"]
        if getattr(task, "windows", None) is not None:
            return [{"windows": len(row)} for row in ids]
        max_length, notes = int(self.b.settings.max_length), []
        for row, ex in zip(ids, examples):
            cut = False
            if len(row) >= max_length:  # full: tokenize it whole to know whether anything was cut
                text = ex["text"] if "text" in ex else task.text(ex)
                whole = self.b.tokenizer(text, ex.get("text_pair"), truncation=False, verbose=False)["input_ids"]
                cut = len(whole) > max_length
            notes.append({"truncated": cut})
        return notes

    def describe(self) -> dict:
        model = self.b.model
        return {"task": self.b.task.name, "head": model.head_kind, "runtime": self.runtime,
                "model_file": getattr(model, "file", None), "labels": self.b.task.labels, "fields": list(self.fields)}


# ---- errors ---------------------------------------------------------------------------------
class RequestError(Exception):
    """A request answered with ``status`` and ``{"error": message, "index": i}`` (index: the
    item at fault, when one is)."""

    def __init__(self, status: int, message: str, index: int | None = None, headers: dict | None = None,
                 id: str | None = None):
        super().__init__(message)
        self.status, self.index, self.headers, self.id = status, index, headers, id


class ItemFailed(Exception):
    """Item ``index`` of a request failed in the model (``error``: why); logged under ``id``."""

    def __init__(self, index: int, error: BaseException, id: str):
        super().__init__(f"item {index}: {type(error).__name__}: {error}")
        self.index, self.error, self.id = index, error, id


class ShuttingDown(Exception):
    """The server is stopping: the request is refused (503) instead of run."""


def error_id() -> str:
    return uuid.uuid4().hex[:8]


def one_line(message: str) -> str:
    return (str(message).strip().splitlines() or ["error"])[0]


def error_body(message: str, **extra) -> bytes:
    return json.dumps({"error": one_line(message), **{k: v for k, v in extra.items() if v is not None}},
                      ensure_ascii=False).encode("utf-8")


# ---- the batcher ----------------------------------------------------------------------------
class Batcher:
    """One worker runs the model; requests queue up and are answered batch by batch. A batch that
    fails is run again one text at a time: only the requests whose own text fails get the error."""

    def __init__(self, predict, max_batch_size: int, max_wait_ms: float):
        self.predict, self.max_batch, self.max_wait = predict, max(1, int(max_batch_size)), max(0.0, max_wait_ms / 1000)
        self.queue: asyncio.Queue | None = None
        self.carry: tuple | None = None  # a request that did not fit the last batch: it opens the next
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kotune-model")
        self.waiting: set[asyncio.Future] = set()  # every request not yet answered
        self.closing = False
        self.stats = {"requests": 0, "texts": 0, "batches": 0, "largest_batch": 0, "model_s": 0.0,
                      "dropped": 0, "failed_items": 0, "refused": 0}

    def enqueue(self, examples: list[dict]) -> asyncio.Future:
        """A future of the request's records; cancel it to take the request back (a client gone)."""
        if self.closing:
            raise ShuttingDown()
        future = asyncio.get_running_loop().create_future()
        self.queue = self.queue or asyncio.Queue()
        self.waiting.add(future)
        future.add_done_callback(self.waiting.discard)
        self.queue.put_nowait((examples, future))
        return future

    async def submit(self, examples: list[dict]) -> list[dict]:
        return await self.enqueue(examples)

    def refuse_all(self) -> int:
        """Every request not yet answered gets :class:`ShuttingDown`; returns how many."""
        refused = 0
        for future in list(self.waiting):
            if not future.done():
                future.set_exception(ShuttingDown())
                refused += 1
        self.stats["refused"] += refused
        return refused

    def _live(self, item: tuple) -> bool:
        """Whether a queued request is still to run: not cancelled (its client went away before
        its turn: dropped), not refused (a shutdown)."""
        if item[1].cancelled():
            self.stats["dropped"] += 1
        return not item[1].done()

    async def _next_batch(self) -> list[tuple]:
        loop = asyncio.get_running_loop()
        first, self.carry = self.carry, None
        while first is None or not self._live(first):
            first = await self.queue.get()
        pending, size, deadline = [first], len(first[0]), loop.time() + self.max_wait
        while size < self.max_batch:
            try:
                item = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
            if not self._live(item):
                continue
            if size + len(item[0]) > self.max_batch:
                self.carry = item
                break
            pending.append(item)
            size += len(item[0])
        return pending

    async def _run(self, examples: list[dict]) -> list[dict]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.predict, examples)

    async def _one_by_one(self, pending: list[tuple], failure: BaseException, n_texts: int) -> None:
        """After ``failure`` of a batch: every text again alone; a request gets its records, or
        the first of its items that fails (logged once, with its index)."""
        for exs, future in pending:
            records = []
            for i, ex in enumerate(exs):
                if future.done():
                    break
                try:
                    records.extend(await self._run([ex]))
                except Exception as e:  # noqa: BLE001 - this request fails; the others are answered
                    failed = ItemFailed(i, e, error_id())
                    self.stats["failed_items"] += 1
                    warn(f"request failed [{failed.id}]: {failed} (a batch of {n_texts} texts failed with "
                         f"{type(failure).__name__}; each text was run again alone, the others answered)")
                    if not future.done():
                        future.set_exception(failed)
                    break
            else:
                if not future.done():
                    future.set_result(records)

    async def run(self) -> None:
        self.queue = self.queue or asyncio.Queue()
        while True:
            pending = [p for p in await self._next_batch() if self._live(p)]
            if not pending:
                continue
            examples = [ex for exs, _ in pending for ex in exs]
            started = time.perf_counter()
            try:
                records = await self._run(examples)
            except Exception as e:  # noqa: BLE001 - one bad text fails its own request, not its batch
                if len(examples) == 1:
                    failed = ItemFailed(0, e, error_id())
                    self.stats["failed_items"] += 1
                    warn(f"request failed [{failed.id}]: {failed}")
                    if not pending[0][1].done():
                        pending[0][1].set_exception(failed)
                else:
                    await self._one_by_one(pending, e, len(examples))
                continue
            self.stats["model_s"] += time.perf_counter() - started
            self.stats["requests"] += len(pending)
            self.stats["texts"] += len(examples)
            self.stats["batches"] += 1
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(examples))
            first = 0
            for exs, future in pending:
                if not future.done():
                    future.set_result(records[first:first + len(exs)])
                first += len(exs)


# ---- requests -------------------------------------------------------------------------------
class Item(BaseModel):
    """One input: the fields of the served task (``Task.request_fields``); strings only."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr | None = None
    text_pair: StrictStr | None = None
    question: StrictStr | None = None
    context: StrictStr | None = None


class PredictRequest(Item):
    """One input, or a list of them in ``inputs`` (the OpenAPI schema of ``POST /predict``)."""

    inputs: list[Item | StrictStr] | None = None


def check_text(value: Any, name: str, max_chars: int) -> str | None:
    """What is wrong with one field's value (None: nothing): not a string, empty, a lone UTF-16
    surrogate (JSON's ``"\\ud800"``: no character, and no UTF-8 for the tokenizer), a NUL, more than
    ``max_chars`` characters."""
    if not isinstance(value, str):
        return f"{name}: a string is expected, got {type(value).__name__ if value is not None else 'null'}"
    if not value.strip():
        return f"{name}: empty"
    if len(value) > max_chars:
        return f"{name}: {len(value)} characters, over serve.max_text_chars={max_chars}"
    if "\x00" in value:
        return f"{name}: a NUL character (\\u0000) at character {value.index(chr(0))}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{name}: a lone surrogate (\\u{ord(value[e.start]):04x}) at character {e.start}; "
                "a character outside the BMP is a \\ud8xx\\udcxx pair")
    return None


def request_items(body: Any, fields: tuple[str, ...], max_items: int,
                  max_chars: int = 10**9) -> tuple[list[dict[str, str]], bool]:
    """The inputs of a parsed JSON body as dicts of ``fields``, and whether it was a single input.
    A :class:`RequestError` says what is wrong, naming the item and its index."""
    takes = ", ".join(fields)
    if not isinstance(body, dict):
        raise RequestError(422, f"body: a JSON object is expected ({{\"{fields[0]}\": ...}} or {{\"inputs\": [...]}}), "
                                f"got {type(body).__name__ if body is not None else 'null'}")
    if "inputs" not in body:
        raw, single = [body], True
    elif set(body) - {"inputs"}:
        raise RequestError(422, f"give one input ({takes}) or a list in 'inputs', not both")
    elif not isinstance(body["inputs"], list):
        raise RequestError(422, f"inputs: a list is expected, got {type(body['inputs']).__name__}")
    else:
        raw, single = body["inputs"], False
    if not raw:
        raise RequestError(422, "inputs: empty")
    if len(raw) > max_items:
        raise RequestError(413, f"{len(raw)} inputs, over serve.max_items={max_items}")
    items = []
    for i, item in enumerate(raw):
        where = "" if single else f"item {i}: "
        if isinstance(item, str) and not single:
            if fields != ("text",):
                raise RequestError(422, f"{where}a string; this task takes objects with {takes}", i)
            item = {"text": item}
        if not isinstance(item, dict):
            raise RequestError(422, f"{where}an object with {takes} is expected, got {type(item).__name__}", i)
        extra = [k for k in item if k not in fields]
        if extra:
            raise RequestError(422, f"{where}{extra[0]}: not a field; this task takes {takes}", i)
        missing = [f for f in fields if f not in item]
        if missing:
            raise RequestError(422, f"{where}{missing[0]}: missing; this task takes {takes}", i)
        for name in fields:
            wrong = check_text(item[name], name, max_chars)
            if wrong:
                raise RequestError(422, where + wrong, i)
        items.append(item)
    return items, single


def data_error(e: DataError, single: bool) -> RequestError:
    """A task's own check of a request (``request:item 3: ...``) as a 422 with the item's index."""
    where = str(e.where or "")
    index = int(where.split()[-1]) if where.startswith("item ") and where.split()[-1].isdigit() else None
    return RequestError(422, (e.what if single else f"{where}: {e.what}") if e.where else str(e), index)


# ---- the ASGI guard -------------------------------------------------------------------------
async def send_json(send, status: int, body: bytes, headers: dict | None = None) -> None:
    extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})


def guard(app, max_body_bytes: int, body_timeout_s: float, api_key: str | None):
    """ASGI middleware in front of the app: ``Authorization: Bearer <serve.api_key>`` when a key is
    set (401), a body over ``max_bytes`` (declared or streamed: 413, unread), a body still arriving
    ``body_timeout_s`` after its request began (408, the connection closed), and a JSON 500 (or 503
    when the server cancels it) for whatever escapes the app."""
    from starlette.exceptions import HTTPException

    key = api_key.encode("utf-8") if api_key else None

    async def guarded(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if key is not None:
            given = headers.get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), key):
                return await send_json(send, 401, error_body("missing or wrong API key: send Authorization: Bearer "
                                                             "<serve.api_key>"), {"www-authenticate": "Bearer"})
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return await send_json(send, 413, error_body(f"request body over serve.max_body_bytes={max_body_bytes}"),
                                   {"connection": "close"})
        loop = asyncio.get_running_loop()
        deadline, received, complete = loop.time() + body_timeout_s, 0, False

        async def limited_receive():
            nonlocal received, complete
            if complete:  # the body is in: what follows is the wait for a disconnect, untimed
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"request body not complete after serve.body_timeout_s={body_timeout_s:g}",
                                    headers={"connection": "close"}) from None
            if message["type"] != "http.request" or not message.get("more_body"):
                complete = True
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > max_body_bytes:
                raise HTTPException(413, f"request body over serve.max_body_bytes={max_body_bytes}",
                                    headers={"connection": "close"})
            return message

        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, limited_receive, tracked_send)
        except asyncio.CancelledError:  # the server's grace period ran out before this request finished
            if started:
                raise
            warn(f"{scope.get('method')} {scope.get('path')}: stopped by the shutdown (503)")
            await send_json(send, 503, error_body("the server is shutting down; retry"), {"connection": "close"})
        except Exception as e:  # noqa: BLE001 - answered as JSON, logged once
            if started:  # the app answered already (its 500 handler), then re-raised
                return
            eid = error_id()
            logger.error(f"error [{eid}]: {scope.get('method')} {scope.get('path')}: {type(e).__name__}: {e}",
                         exc_info=e)
            await send_json(send, 500, error_body(f"internal error {eid}: {type(e).__name__}", id=eid))

    return guarded


def body_limit(app, max_bytes: int):
    """A body over ``max_bytes`` gets 413 (the guard without a key or a body time limit)."""
    return guard(app, max_bytes, 3600.0, None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_api_key(cfg: DictConfig, environ: dict) -> str | None:
    """``serve.api_key``, else the environment's ``KOTUNE_API_KEY``; None (no key) when neither is set."""
    key = cfg.serve.get("api_key")
    key = str(key) if key not in (None, "") else environ.get(API_KEY_ENV) or None
    return key


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


def create_app(predictor, batcher: Batcher, max_items: int, max_body_bytes: int, *, max_text_chars: int = 100_000,
               body_timeout_s: float = 10.0, api_key: str | None = None, docs: bool = False):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    @asynccontextmanager
    async def lifespan(app):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        batcher.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="kotune", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)

    def error(status: int, message: str, headers: dict | None = None, **extra) -> Response:
        return Response(error_body(message, **extra), status_code=status, headers=headers,
                        media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        eid = error_id()
        logger.error(f"error [{eid}]: {request.method} {request.url.path}: {type(exc).__name__}: {exc}", exc_info=exc)
        return error(500, f"internal error {eid}: {type(exc).__name__}", id=eid)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "shutting down" if batcher.closing else "ok", **predictor.describe(),
                "max_batch_size": batcher.max_batch, "max_wait_ms": batcher.max_wait * 1000, **batcher.stats,
                "in_flight": len(batcher.waiting)}

    async def predict(request, echo: bool = False):
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to log
            return Response(status_code=499)
        try:
            body = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            return error(400, f"body: not JSON ({getattr(e, 'msg', type(e).__name__)}"
                              f"{f' at character {e.pos}' if getattr(e, 'pos', None) is not None else ''})")
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
            return error(e.status, str(e), e.headers, index=e.index, id=e.id)
        if records is None:  # the client is gone: nobody reads this
            return Response(status_code=499)
        if not echo:
            records = [{k: v for k, v in r.items() if k not in ECHOED} for r in records]
        return records[0] if single else {"predictions": records}

    predict.__annotations__.update(request=Request, echo=bool)  # the body is read and checked above, by hand
    app.post("/predict", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": PredictRequest.model_json_schema()}}}})(predict)

    return guard(app, max_body_bytes, body_timeout_s, api_key)


def make_server(app, batcher: Batcher, host: str, port: int, *, keep_alive_s: float = 5.0,
                shutdown_grace_s: float = 5.0):
    """A uvicorn server whose shutdown answers every request in flight: new ones get 503 at once,
    those already queued are run while the grace period lasts (less a margin to send the answers),
    then the rest get a 503 JSON answer; the log says how many of each."""
    import uvicorn

    drain_s = max(shutdown_grace_s - 1.0, shutdown_grace_s / 2)

    class Server(uvicorn.Server):
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

    return Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                 timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=shutdown_grace_s))
