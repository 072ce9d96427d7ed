"""The serving micro-batcher's two stages and its token budget (kotune/serving/batcher.py,
kotune/serving/predictor.py), in-process on the CPU: the next batch is tokenized and padded while the
model runs the current one (a fake forward that waits for that, and fails the test without it), a
request whose client is gone after its batch was prepared is not run, a batch that fails in any stage
fails only its bad request; with ``predict.batch_tokens`` queued requests are joined in arrival order
while their tokens fit it (one model call a batch), a request that cannot be sized runs and fails
alone; with the tiny model, every model call the server makes is within rows × padded length, a
request longer than the budget is a batch alone split over several calls, and every answer, in
request order, is the one-at-a-time answer."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest

from conftest import ROOT, compose

DEMO = ["task=text_cls", "model=tiny", "data=demo"]
TIMEOUT_S = 10  # a fake forward's wait for the next batch to be prepared


@dataclass
class Staged:
    """A staged predictor without a model: prepare upper-cases the texts (a text "bad-<stage>" fails
    that stage), compute runs ``on_compute`` first; every call is recorded with its thread."""

    on_compute: object = None
    log: list = field(default_factory=list)
    prepared: list = field(default_factory=list)  # batches prepared, in order (their texts)
    batch_tokens: int | None = None  # set: the batcher joins requests by sizes() (a row per text, its length)

    def sizes(self, examples):
        if any(e["text"] == "bad-prepare" for e in examples):  # what cannot be tokenized cannot be sized
            raise ValueError("cannot tokenize")
        return [(1, len(e["text"])) for e in examples]

    def prepare(self, examples):
        self.log.append(("prepare", threading.current_thread().name, [e["text"] for e in examples]))
        if any(e["text"] == "bad-prepare" for e in examples):
            raise ValueError("cannot tokenize")
        self.prepared.append([e["text"] for e in examples])
        return [e["text"].upper() for e in examples]

    def compute(self, prepared):
        self.log.append(("compute", threading.current_thread().name, list(prepared)))
        if self.on_compute is not None:
            self.on_compute(prepared)
        if "BAD-COMPUTE" in prepared:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return [f"<{t}>" for t in prepared]

    def finish(self, prepared, outputs):
        if "BAD-FINISH" in prepared:
            raise KeyError("decode")
        return [{"prediction": o} for o in outputs]


def served(predictor, requests: list[list[str]], max_batch_size: int, max_wait_ms: float = 200, during=None):
    """Every request submitted at once to a running Batcher: (the batcher, each request's answer or error)."""
    from kotune.serving.batcher import Batcher

    async def main():
        batcher = Batcher(predictor, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        worker = asyncio.create_task(batcher.run())
        futures = [batcher.enqueue([{"text": t} for t in texts]) for texts in requests]
        if during is not None:
            await during(futures)
        answers = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 60)
        worker.cancel()
        batcher.close()
        return batcher, answers

    return asyncio.run(main())


def test_the_next_batch_is_prepared_while_the_model_runs_the_current_one():
    """The first batch's forward waits (up to 10 s) for the second batch to be prepared: one thread
    doing both would wait the 10 s out and record False. Each stage on its own thread, answers in order."""
    predictor = Staged()
    overlapped = []

    def wait_for_the_next(prepared):
        if not overlapped:
            deadline = time.monotonic() + TIMEOUT_S
            while len(predictor.prepared) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            overlapped.append(len(predictor.prepared) >= 2)

    predictor.on_compute = wait_for_the_next
    requests = [[f"t{i}"] for i in range(6)]
    started = time.monotonic()
    batcher, answers = served(predictor, requests, max_batch_size=2)
    assert overlapped == [True] and time.monotonic() - started < TIMEOUT_S
    assert answers == [[{"prediction": f"<T{i}>"}] for i in range(6)]
    stages = {(stage, thread.rsplit("_", 1)[0]) for stage, thread, _ in predictor.log}
    assert stages == {("prepare", "kotune-prepare"), ("compute", "kotune-model")}
    assert [texts for stage, _, texts in predictor.log if stage == "compute"] == [["T0", "T1"], ["T2", "T3"], ["T4", "T5"]]
    assert batcher.stats["batches"] == 3 and batcher.stats["model_calls"] == 3 and batcher.stats["texts"] == 6


def test_a_request_whose_client_left_after_its_batch_was_prepared_is_not_run():
    """Batch 2 is prepared while batch 1 runs; its client hangs up before the model is free: it is dropped."""
    predictor = Staged()
    gone = threading.Event()
    predictor.on_compute = lambda prepared: prepared == ["T0"] and gone.wait(TIMEOUT_S)

    async def hang_up(futures):
        for _ in range(int(TIMEOUT_S / 0.01)):
            if len(predictor.prepared) >= 2:
                break
            await asyncio.sleep(0.01)
        futures[1].cancel()
        gone.set()

    batcher, answers = served(predictor, [["t0"], ["t1"], ["t2"]], max_batch_size=1, during=hang_up)
    assert answers[0] == [{"prediction": "<T0>"}] and answers[2] == [{"prediction": "<T2>"}]
    assert isinstance(answers[1], asyncio.CancelledError)
    assert [texts for stage, _, texts in predictor.log if stage == "compute"] == [["T0"], ["T2"]]
    assert batcher.stats["dropped"] == 1 and batcher.stats["requests"] == 2


@pytest.mark.parametrize("stage", ["prepare", "compute", "finish"])
def test_a_batch_failing_in_any_stage_fails_only_the_bad_request(stage):
    from kotune.serving.requests import ItemFailed

    requests = [[f"t{i}"] for i in range(10)] + [["ok", f"bad-{stage}", "fine"]] + [["t10"]]
    batcher, answers = served(Staged(), requests, max_batch_size=64)
    assert answers[:10] == [[{"prediction": f"<T{i}>"}] for i in range(10)]
    assert answers[11] == [{"prediction": "<T10>"}]
    assert isinstance(answers[10], ItemFailed) and answers[10].index == 1
    assert batcher.stats["failed_items"] == 1


def test_queued_requests_are_joined_by_tokens_in_arrival_order_and_one_that_cannot_be_sized_fails_alone(monkeypatch):
    """A budget of 40 and texts of 10 (a row each): four requests a batch, in the order they came; a
    request that cannot be tokenized closes the batch before it, runs alone and fails alone, and the
    log says so once, by the error's kind (no request text); serve.max_batch_size still caps the texts
    of a batch under a budget it does not reach."""
    from kotune.serving import batcher as batching
    from kotune.serving.requests import ItemFailed

    said = []
    monkeypatch.setattr(batching, "warn", said.append)

    texts = [f"text-{i:05d}" for i in range(9)]
    requests = [[t] for t in texts[:6]] + [["bad-prepare"]] + [[t] for t in texts[6:]]
    predictor = Staged(batch_tokens=40)
    batcher, answers = served(predictor, requests, max_batch_size=64)
    assert predictor.prepared == [texts[:4], texts[4:6], texts[6:]]
    assert isinstance(answers[6], ItemFailed) and batcher.stats["failed_items"] == 1
    assert [a for i, a in enumerate(answers) if i != 6] == [[{"prediction": f"<{t.upper()}>"}] for t in texts]
    assert batcher.stats["batches"] == 3 and batcher.stats["closed_on_tokens"] == 3
    assert said[0] == "serve: a request could not be sized for predict.batch_tokens (ValueError); it runs alone"
    assert len(said) == 2 and said[1].startswith("request failed [")  # then its preparing fails it, alone

    predictor = Staged(batch_tokens=1000)
    batcher, answers = served(predictor, [[t] for t in texts[:5]], max_batch_size=2)
    assert predictor.prepared == [texts[:2], texts[2:4], texts[4:5]] and batcher.stats["closed_on_tokens"] == 0


# ---- the token budget, with a model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def predictor(tmp_path_factory, cache_dir):
    """The server's Predictor over a tiny model trained briefly, with predict.batch_tokens=256."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries
    from kotune.serving.predictor import Predictor

    quiet_libraries()
    run = tmp_path_factory.mktemp("batching") / "train"
    res = execute(compose([*DEMO, "data.max_train_samples=200", "train.max_steps=20", f"cache_dir={cache_dir}"]),
                  str(run))
    assert res["status"] == "ok", res.get("error")
    return Predictor(compose([*DEMO, "action=serve", f"checkpoint={run}", f"cache_dir={cache_dir}",
                              "predict.batch_tokens=256"]))


def demo_texts(n: int) -> list[str]:
    lines = (ROOT / "kotune_data" / "demo" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:n + 1]
    return [line.split("\t")[1] for line in lines]


def same_answers(ours: list[dict], theirs: list[dict]) -> bool:
    """Equal records, probabilities to float rounding (fp32 logits of other batch shapes)."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert {k: v for k, v in a.items() if k != "probabilities"} == {k: v for k, v in b.items() if k != "probabilities"}
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5)
    return True


def test_model_calls_keep_the_token_budget_and_answers_equal_one_at_a_time(predictor):
    """40 short requests, a 24-item request of texts near max_length (its padded tokens far past 256) and
    a few in between, all at once: every model call is within 256 tokens (rows × padded length), the long
    request is split over several calls, and each request's answers (in its order) are one-at-a-time's."""
    texts = demo_texts(60)
    long = [(t + " ") * 12 for t in texts[40:60]] + [texts[0] * 30] * 4  # about max_length tokens each
    requests = [[t] for t in texts[:40]] + [long] + [texts[:3], texts[5:7]]
    alone = [[predictor.answer(predictor.examples([{"text": t}]))[0] for t in r] for r in requests]
    shapes, forward = [], predictor.batches.forward

    def recording(batch):
        shapes.append(tuple(batch["input_ids"].shape))
        return forward(batch)

    predictor.batches.forward = recording
    try:
        batcher, answers = served_examples(predictor, requests, max_batch_size=64)
    finally:
        predictor.batches.forward = forward
    assert all(not isinstance(a, BaseException) for a in answers), answers
    for ours, theirs in zip(answers, alone):
        assert same_answers(ours, theirs)
    assert sum(n for n, _ in shapes) == sum(len(r) for r in requests)
    assert all(n * length <= 256 for n, length in shapes), shapes
    long_calls = [s for s in shapes if s[1] >= 96]
    assert len(long_calls) >= 6  # 24 texts of ~128 tokens, 2 a call at most
    assert batcher.stats["largest_call_tokens"] <= 256 and batcher.stats["model_calls"] == len(shapes)
    assert batcher.stats["largest_batch"] == 24  # the long request, a batch alone; the short ones joined
    assert batcher.stats["batches"] < len(requests) - 1 and batcher.stats["call_tokens"] <= 256 * len(shapes)


def text_of(predictor, tokens: int, word: str = "가") -> str:
    """A text of ``tokens`` tokens with the special ones (``word``: one token in the tiny vocabulary)."""
    text = " ".join([word] * (tokens - 2))
    assert len(predictor.b.tokenizer(text)["input_ids"]) == tokens
    return text


def test_queued_requests_are_joined_into_one_call_while_their_tokens_fit_and_a_long_one_is_split_alone(predictor):
    """Eight requests queued at once, a budget of 256 tokens (rows × padded length): four of 64 tokens
    fill one call; the next (32) opens the second batch, three more of 32 join it; six texts of 128
    (768 tokens) do not fit it: a batch alone, split into three calls of two; the last request is a
    batch of its own after it. serve.max_batch_size (64 texts) would have joined them all."""
    requests = [[text_of(predictor, 64, w)] for w in ("가", "좋다", "a", "가")]
    requests += [[text_of(predictor, 32)], [text_of(predictor, 32, w) for w in ("좋다", "a", "가")]]
    requests += [[text_of(predictor, 128, w) for w in ("가", "좋다", "a") * 2], [text_of(predictor, 16, "a")] * 2]
    alone = [[predictor.answer(predictor.examples([{"text": t}]))[0] for t in r] for r in requests]
    joined, prepare = [], predictor.prepare

    def recording(examples):
        joined.append(len(examples))
        return prepare(examples)

    predictor.prepare = recording
    try:
        batcher, answers = served_examples(predictor, requests, max_batch_size=64)
    finally:
        del predictor.prepare
    assert all(not isinstance(a, BaseException) for a in answers), answers
    for ours, theirs in zip(answers, alone):
        assert same_answers(ours, theirs)
    assert joined == [4, 4, 6, 2]  # texts a batch: the requests joined in the order they came
    stats = batcher.stats
    assert stats["batches"] == 4 and stats["model_calls"] == 6 and stats["closed_on_tokens"] == 3
    assert stats["largest_call_tokens"] == 256 and stats["call_tokens"] == 256 + 128 + 3 * 256 + 32


def served_examples(predictor, requests: list[list[str]], max_batch_size: int):
    """As :func:`served`, the texts made the task's examples first (as the app does)."""
    from kotune.serving.batcher import Batcher

    async def main():
        batcher = Batcher(predictor, max_batch_size=max_batch_size, max_wait_ms=200)
        worker = asyncio.create_task(batcher.run())
        futures = [batcher.enqueue(predictor.examples([{"text": t} for t in texts])) for texts in requests]
        answers = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 300)
        worker.cancel()
        batcher.close()
        return batcher, answers

    return asyncio.run(main())


def test_the_three_stages_are_the_answer(predictor):
    """prepare → compute → finish gives what answer() gives (action=predict's path), call cuts included."""
    examples = predictor.examples([{"text": t} for t in demo_texts(12)] + [{"text": "아주 긴 문장 " * 60}])
    prepared = predictor.prepare(examples)
    assert len(prepared.calls) >= 2 and all(0 < t <= 256 for t in prepared.tokens)
    assert same_answers(predictor.finish(prepared, predictor.compute(prepared)), predictor.answer(examples))
