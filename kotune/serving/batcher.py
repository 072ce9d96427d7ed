"""The micro-batcher of ``action=serve``: concurrent requests joined into batches of up to
``serve.max_batch_size`` texts, the first waiting at most ``serve.max_wait_ms``; a batch that fails is
run again one text at a time, so that only the request holding the bad text fails."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from kotune.serving.requests import ItemFailed, ShuttingDown, error_id
from kotune.core.log import warn


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
