"""The micro-batcher of ``action=serve``: concurrent requests joined into batches of up to
``serve.max_batch_size`` texts, the first waiting at most ``serve.max_wait_ms``; a batch that fails is
run again one text at a time, so that only the request holding the bad text fails.

With ``predict.batch_tokens`` (the predictor's ``batch_tokens`` and ``sizes``), requests are joined by
tokens too, as text-embeddings-inference's ``max_batch_tokens`` joins them: in arrival order, while the
joined rows × their longest (padded) row stay within the budget, so that a joined batch is one model
call; the first request that would pass it opens the next batch (nothing is reordered, nothing
starves), and a request over the budget on its own is a batch alone, split over several calls.

Two stages feed the model, so that it does not wait for tokenizing: a feeder joins a batch, then
tokenizes and pads it on its own thread (``predict.prepare``: the batch cut into model calls of
``train.eval_batch_size`` rows or within ``predict.batch_tokens`` rows × padded length, a long request
split over several) and hands it over through a queue of one ready batch, while the model thread runs
the batch before it (``predict.compute``); the outputs are decoded into answers on the feeder's thread
(``predict.finish``), in order. While the model is busy a batch that is not full goes on taking
requests past ``serve.max_wait_ms``: it closes full (and is prepared ahead), or when the model is
free. ``predict`` is a staged predictor (kotune/serving/predictor.py: ``prepare``, ``compute``,
``finish``) or any function of examples to records (then one stage: the model thread calls it)."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from heads.model.inference import token_batches
from kotune.serving.requests import ItemFailed, ShuttingDown, error_id
from kotune.core.log import warn


def fits(held: tuple[int, int], more: tuple[int, int], batch_tokens: int) -> bool:
    """Whether rows of (count, longest) ``held`` and ``more`` fit one call of ``batch_tokens``: the
    cut of every model call (heads/model/inference.py's ``token_batches``) on the two, longest first."""
    return len(token_batches(sorted([held, more], key=lambda size: -size[1]), batch_tokens, 1)) == 1


def rows_of(sizes: list[tuple[int, int]]) -> tuple[int, int]:
    """(rows, longest) of a request's row sizes: what a call holding them all pads to."""
    return sum(n for n, _ in sizes), max((length for _, length in sizes), default=0)


def stages(predict) -> tuple:
    """(prepare, compute, finish) of ``predict``: its own, or a plain function as the compute stage."""
    if all(callable(getattr(predict, name, None)) for name in ("prepare", "compute", "finish")):
        return predict.prepare, predict.compute, predict.finish
    return (lambda examples: examples), predict, (lambda prepared, records: records)


# ---- the batcher ----------------------------------------------------------------------------
class Batcher:
    """One worker runs the model; requests queue up and are answered batch by batch, the next batch
    prepared while the model runs the current one. A batch that fails is run again one text at a time:
    only the requests whose own text fails get the error."""

    def __init__(self, predict, max_batch_size: int, max_wait_ms: float):
        self.predict, self.max_batch, self.max_wait = predict, max(1, int(max_batch_size)), max(0.0, max_wait_ms / 1000)
        self.prepare, self.compute, self.finish = stages(predict)
        # predict.batch_tokens, where the predictor can size a request before it is prepared: joined by tokens
        self.sizes = getattr(predict, "sizes", None)
        self.batch_tokens = getattr(predict, "batch_tokens", None) if callable(self.sizes) else None
        self.queue: asyncio.Queue | None = None
        self.ready: asyncio.Queue | None = None  # one prepared batch waiting for the model
        self.idle: asyncio.Event | None = None  # set while the model waits for a batch
        self.carry: tuple | None = None  # a request that did not fit the last batch: it opens the next
        self.carry_rows: tuple[int, int] | None = None  # its (rows, longest), with predict.batch_tokens
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kotune-model")
        self.feeder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kotune-prepare")
        self.finishing: set[asyncio.Task] = set()
        self.waiting: set[asyncio.Future] = set()  # every request not yet answered
        self.closing = False
        self.stats = {"requests": 0, "texts": 0, "batches": 0, "largest_batch": 0, "model_s": 0.0,
                      "model_calls": 0, "largest_call_tokens": 0, "call_tokens": 0, "closed_on_tokens": 0,
                      "prepare_s": 0.0,
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

    def close(self) -> None:
        """The threads stop (what is queued on them is cancelled): the server is stopping."""
        for pool in (self.executor, self.feeder):
            pool.shutdown(wait=False, cancel_futures=True)

    def _live(self, item: tuple) -> bool:
        """Whether a queued request is still to run: not cancelled (its client went away before
        its turn: dropped), not refused (a shutdown)."""
        if item[1].cancelled():
            self.stats["dropped"] += 1
        return not item[1].done()

    # ---- the feeder: join, prepare, hand over ----
    async def _get(self, deadline: float) -> tuple | None:
        """The next queued request; None once ``deadline`` has passed and the model is free (while
        it is busy the batch goes on taking requests: it cannot run sooner)."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue.empty():
                return self.queue.get_nowait()
            wait = deadline - loop.time()
            if wait <= 0 and self.idle.is_set():
                return None
            getter = asyncio.ensure_future(self.queue.get())
            other = asyncio.ensure_future(asyncio.sleep(wait) if wait > 0 else self.idle.wait())
            try:
                await asyncio.wait({getter, other}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                other.cancel()
                got = getter.done()
                if not got:
                    getter.cancel()  # asyncio.Queue.get taken back before it took a request: none is lost
            if got:
                return getter.result()

    async def _next_batch(self) -> list[tuple]:
        """The requests of the next batch, in arrival order: up to ``serve.max_batch_size`` texts and,
        with ``predict.batch_tokens``, while their rows × longest row fit it."""
        loop = asyncio.get_running_loop()
        first, held, self.carry, self.carry_rows = self.carry, self.carry_rows, None, None
        while first is None or not self._live(first):
            first, held = await self.queue.get(), None
        if self.batch_tokens and held is None:
            held = await self._rows(first)
        pending, size, deadline = [first], len(first[0]), loop.time() + self.max_wait
        while size < self.max_batch:
            item = await self._get(deadline)
            if item is None:
                break
            if not self._live(item):
                continue
            rows = await self._rows(item) if self.batch_tokens else None
            over = rows is not None and not fits(held, rows, self.batch_tokens)
            if over or size + len(item[0]) > self.max_batch:
                self.carry, self.carry_rows = item, rows
                self.stats["closed_on_tokens"] += over
                break
            pending.append(item)
            size += len(item[0])
            if rows is not None:
                held = (held[0] + rows[0], max(held[1], rows[1]))
        return pending

    async def _rows(self, item: tuple) -> tuple[int, int]:
        """(rows, longest padded row) of a queued request, tokenized on the feeder's thread; one that
        cannot be tokenized counts as over the budget: it runs alone, and fails alone."""
        try:
            return rows_of(await self._on(self.feeder, self.sizes, item[0]))
        except Exception as e:  # noqa: BLE001 - its own batch's prepare fails it, text by text
            # said (its kind only: a request's text stays out of the log), in case preparing it succeeds
            warn(f"serve: a request could not be sized for predict.batch_tokens ({type(e).__name__}); it runs alone")
            return 1, self.batch_tokens + 1

    async def _feed(self) -> None:
        """Join a batch, prepare it on the feeder's thread, hand it over; the next batch is joined
        once the model has taken this one (one batch prepared ahead, no more)."""
        while True:
            pending = [p for p in await self._next_batch() if self._live(p)]
            if not pending:
                continue
            examples = [ex for exs, _ in pending for ex in exs]
            started = time.perf_counter()
            try:
                prepared = await self._on(self.feeder, self.prepare, examples)
            except Exception as e:  # noqa: BLE001 - the model's side reruns it text by text
                prepared = e
            self.stats["prepare_s"] += time.perf_counter() - started
            await self.ready.put((pending, examples, prepared))
            await self.ready.join()  # taken by the model: join the next batch meanwhile

    async def _on(self, pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # ---- the model: run, answer ----
    async def run(self) -> None:
        self.queue = self.queue or asyncio.Queue()
        self.ready, self.idle = asyncio.Queue(maxsize=1), asyncio.Event()
        feeder = asyncio.ensure_future(self._feed())
        try:
            while True:
                self.idle.set()
                pending, examples, prepared = await self.ready.get()
                self.idle.clear()
                self.ready.task_done()
                if all(future.done() for _, future in pending):  # every client gone (or refused): not run
                    self.stats["dropped"] += sum(future.cancelled() for _, future in pending)
                    continue
                await self._compute(pending, examples, prepared)
        finally:
            feeder.cancel()
            for task in list(self.finishing):
                task.cancel()

    async def _compute(self, pending: list[tuple], examples: list[dict], prepared) -> None:
        started = time.perf_counter()
        try:
            if isinstance(prepared, Exception):
                raise prepared
            outputs = await self._on(self.executor, self.compute, prepared)
        except Exception as e:  # noqa: BLE001 - one bad text fails its own request, not its batch
            await self._failed(pending, examples, e)
            return
        self.stats["model_s"] += time.perf_counter() - started
        tokens = getattr(prepared, "tokens", None) or [0]
        self.stats["model_calls"] += len(getattr(prepared, "calls", None) or [prepared])
        self.stats["largest_call_tokens"] = max(self.stats["largest_call_tokens"], *tokens)
        self.stats["call_tokens"] += sum(tokens)
        task = asyncio.ensure_future(self._answer(pending, examples, prepared, outputs))  # decoded meanwhile
        self.finishing.add(task)
        task.add_done_callback(self.finishing.discard)

    async def _answer(self, pending: list[tuple], examples: list[dict], prepared, outputs) -> None:
        try:
            records = await self._on(self.feeder, self.finish, prepared, outputs)
        except Exception as e:  # noqa: BLE001 - as a failed forward: text by text
            await self._failed(pending, examples, e)
            return
        self.stats["requests"] += len(pending)
        self.stats["texts"] += len(examples)
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(examples))
        first = 0
        for exs, future in pending:
            if not future.done():
                future.set_result(records[first:first + len(exs)])
            first += len(exs)

    async def _alone(self, examples: list[dict]) -> list[dict]:
        """``examples`` through the three stages, as a batch of their own."""
        prepared = await self._on(self.feeder, self.prepare, examples)
        outputs = await self._on(self.executor, self.compute, prepared)
        return await self._on(self.feeder, self.finish, prepared, outputs)

    async def _failed(self, pending: list[tuple], examples: list[dict], failure: Exception) -> None:
        """A batch that failed (its preparing, its forward or its decoding): a lone text's request gets
        the error, else every text runs again alone."""
        if len(examples) > 1:
            await self._one_by_one(pending, failure, len(examples))
            return
        failed = ItemFailed(0, failure, error_id())
        self.stats["failed_items"] += 1
        warn(f"request failed [{failed.id}]: {failed}")
        if not pending[0][1].done():
            pending[0][1].set_exception(failed)

    async def _one_by_one(self, pending: list[tuple], failure: BaseException, n_texts: int) -> None:
        """After ``failure`` of a batch: every text again alone; a request gets its records, or
        the first of its items that fails (logged once, with its index)."""
        for exs, future in pending:
            records = []
            for i, ex in enumerate(exs):
                if future.done():
                    break
                try:
                    records.extend(await self._alone([ex]))
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
