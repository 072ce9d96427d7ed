"""``action=serve``'s pieces: the :class:`Predictor` (inputs → the records action=predict writes,
through the same encoding, length-sorted batches, decoding and records), the :class:`Batcher`
(concurrent requests joined into batches of up to ``serve.max_batch_size`` texts, the first
waiting at most ``serve.max_wait_ms``), and the FastAPI app (``POST /predict``, ``GET /health``).

A request is one input, ``{"text": "..."}`` (``text_pair`` for pair tasks, ``question`` and
``context`` for QA), or a list of them: ``{"inputs": [{...}, ...]}`` (for single-text tasks plain
strings do: ``{"inputs": ["...", "..."]}``). The answer is the predictions.jsonl record without its
id: ``{"prediction": ...}``, or ``{"predictions": [...]}`` for a list. A bad request gets a 4xx
JSON ``{"error": "one line"}`` and the server goes on."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from omegaconf import DictConfig
from pydantic import BaseModel, ConfigDict, StrictStr

from kotune.build import build, make_collator
from kotune.predict import BatchPredictor, predict_rows, torch_forward
from tasks import build_task
from tasks.errors import ConfigError, DataError


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

    def __call__(self, examples: list[dict]) -> list[dict]:
        task = self.b.task
        features = task.encode(examples, self.b.tokenizer, self.b.settings)
        inputs = features.select_columns(task.model_columns(features))
        outputs, _ = predict_rows(self.batches, task, features, inputs, examples)
        return [{k: v for k, v in r.items() if k != "id"} for r in task.prediction_records(outputs, examples)]

    def describe(self) -> dict:
        model = self.b.model
        return {"task": self.b.task.name, "head": model.head_kind, "runtime": self.runtime,
                "model_file": getattr(model, "file", None), "labels": self.b.task.labels, "fields": list(self.fields)}


class Batcher:
    """One worker runs the model; requests queue up and are answered batch by batch."""

    def __init__(self, predict, max_batch_size: int, max_wait_ms: float):
        self.predict, self.max_batch, self.max_wait = predict, max(1, int(max_batch_size)), max(0.0, max_wait_ms / 1000)
        self.queue: asyncio.Queue | None = None
        self.carry: tuple | None = None  # a request that did not fit the last batch: it opens the next
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kotune-model")
        self.stats = {"requests": 0, "texts": 0, "batches": 0, "largest_batch": 0, "model_s": 0.0}

    async def submit(self, examples: list[dict]) -> list[dict]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((examples, future))
        return await future

    async def _next_batch(self) -> list[tuple]:
        loop = asyncio.get_running_loop()
        first, self.carry = self.carry or await self.queue.get(), None
        pending, size, deadline = [first], len(first[0]), loop.time() + self.max_wait
        while size < self.max_batch:
            try:
                item = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
            if size + len(item[0]) > self.max_batch:
                self.carry = item
                break
            pending.append(item)
            size += len(item[0])
        return pending

    async def run(self) -> None:
        self.queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        while True:
            pending = await self._next_batch()
            examples = [ex for exs, _ in pending for ex in exs]
            started = time.perf_counter()
            try:
                records = await loop.run_in_executor(self.executor, self.predict, examples)
            except Exception as e:  # noqa: BLE001 - one bad batch fails its requests, not the server
                for _, future in pending:
                    if not future.done():
                        future.set_exception(e)
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


class Item(BaseModel):
    """One input: the fields of the served task (``Task.request_fields``); strings only."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr | None = None
    text_pair: StrictStr | None = None
    question: StrictStr | None = None
    context: StrictStr | None = None


class PredictRequest(Item):
    """One input, or a list of them in ``inputs``."""

    inputs: list[Item | StrictStr] | None = None


def body_limit(app, max_bytes: int):
    """ASGI middleware: a body over ``max_bytes`` (declared or streamed) gets 413, unread."""
    from starlette.responses import JSONResponse

    too_large = JSONResponse({"error": f"request body over serve.max_body_bytes={max_bytes}"}, status_code=413)

    async def limited_app(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            return await too_large(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > max_bytes:
                from starlette.exceptions import HTTPException

                raise HTTPException(413, f"request body over serve.max_body_bytes={max_bytes}")
            return message

        return await app(scope, counting_receive, send)

    return limited_app


def request_items(body, fields: tuple[str, ...], max_items: int) -> tuple[list[dict[str, str]], bool]:
    """The inputs of a request body (the pydantic model below) as dicts of ``fields``, and whether
    it was a single input; a ValueError says what is wrong."""
    given = {k: v for k, v in body.model_dump(exclude_none=True).items() if k != "inputs"}
    if body.inputs is None:
        raw, single = [given], True
    elif given:
        raise ValueError(f"give one input ({', '.join(fields)}) or a list in 'inputs', not both")
    else:
        raw, single = list(body.inputs), False
    if not raw:
        raise ValueError("'inputs' is empty")
    if len(raw) > max_items:
        raise OverflowError(f"{len(raw)} inputs, over serve.max_items={max_items}")
    items = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            if fields != ("text",):
                raise ValueError(f"request:item {i}: a string; this task takes objects with {', '.join(fields)}")
            item = {"text": item}
        elif not isinstance(item, dict):
            item = item.model_dump(exclude_none=True)
        missing, extra = [f for f in fields if f not in item], sorted(set(item) - set(fields))
        if missing or extra:
            what = f"missing field '{missing[0]}'" if missing else f"field '{extra[0]}' does not apply"
            raise ValueError(f"request:item {i}: {what} (this task takes {', '.join(fields)})")
        items.append(item)
    return items, single


def create_app(predictor, batcher: Batcher, max_items: int, max_body_bytes: int):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(app):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        batcher.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="kotune", lifespan=lifespan)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message.splitlines()[0] if message else "error"}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(where) if any(p.isalpha() for p in where) else "body"  # (body, 0): the JSON itself
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **predictor.describe(), "max_batch_size": batcher.max_batch,
                "max_wait_ms": batcher.max_wait * 1000, **batcher.stats}

    @app.post("/predict")
    async def predict(body: PredictRequest):
        try:
            items, single = request_items(body, predictor.fields, max_items)
            examples = predictor.examples(items)
        except OverflowError as e:
            return error(413, str(e))
        except (ValueError, DataError) as e:
            return error(422, str(e))
        try:
            records = await batcher.submit(examples)
        except DataError as e:
            return error(422, str(e))
        except Exception as e:  # noqa: BLE001 - answered, logged by the caller's client; the server goes on
            return error(500, f"{type(e).__name__}: {e}")
        return records[0] if single else {"predictions": records}

    return body_limit(app, max_body_bytes)
