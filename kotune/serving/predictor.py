"""``action=serve``'s :class:`Predictor`: inputs → the records action=predict writes, through the same
encoding, length-sorted batches, decoding and records; and the same answer in three stages, so that
the micro-batcher (kotune/serving/batcher.py) can tokenize and pad the next batch on one thread while
the model runs the current one on another:

- :meth:`Predictor.prepare`: encode the examples, sort their rows by length and cut them into model
  calls (``train.eval_batch_size`` rows, or with ``predict.batch_tokens`` as many as keep rows × padded
  length within it: heads/model/inference.py's ``token_batches``, as action=predict cuts them), each
  padded by the training collator;
- :meth:`Predictor.compute`: the model's forward on each call, nothing else (the model thread);
- :meth:`Predictor.finish`: the outputs back in input order, decoded into the records.

With ``predict.batch_tokens`` the batcher joins requests by their tokens before any is prepared:
:meth:`Predictor.sizes` counts them with the tokenizer alone.

``finish(prepare(x), compute(prepare(x)))`` is ``answer(x)``, call for call (tests/test_serve_batching.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from kotune.loading.from_checkpoint import build_from_checkpoint
from heads.model.inference import concat_padded
from kotune.inference.model_runtimes import batch_predictor
from kotune.inference.predict import predict_rows
from heads.model.inference import row_sizes, token_batches
from tasks import build_task
from tasks.abstention import abstained, mark
from kotune.core.errors import ConfigError


def servable(task) -> None:
    """A one-line refusal for a task whose input is more than plain text."""
    if task.request_fields is None:
        raise ConfigError(f"action=serve: task {task.name} reads more than plain text (its files mark entities "
                          "or words with their annotations); predict a file with action=predict")


@dataclass
class Prepared:
    """A batch of examples ready for the model: their features, the length order of their rows, and
    the padded inputs of each model call (``tokens``: each call's rows × padded length)."""

    examples: list[dict]
    features: Any
    order: Any
    calls: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def padded_tokens(batch: dict) -> int:
    """Rows × padded length of a collated batch (windows count as rows), 0 without token inputs."""
    ids = batch.get("input_ids", batch.get("attention_mask"))
    return int(ids.shape[0] * ids.shape[1]) if ids is not None and getattr(ids, "ndim", 0) >= 2 else 0


class Predictor:
    """The model of ``checkpoint=`` (a kotune checkpoint or an ONNX export) behind a call from
    examples to records."""

    def __init__(self, cfg: DictConfig):
        servable(build_task(cfg.task))
        self.b = build_from_checkpoint(cfg, (), onnx=True)
        servable(self.b.task)
        self.runtime = str(self.b.model.runtime)  # torch (a checkpoint), onnxruntime (an ONNX export): kotune/inference/model_runtimes.py
        # predict.device / precision / batch_tokens: the one forward every inference path runs (heads/model/inference.py)
        self.batches = batch_predictor(cfg, self.b.model, self.b.collator)

    @property
    def batch_tokens(self) -> int | None:
        """``predict.batch_tokens``: the batcher joins requests within it (kotune/serving/batcher.py)."""
        return self.batches.batch_tokens

    @property
    def fields(self) -> tuple[str, ...]:
        return self.b.task.request_fields

    def examples(self, items: list[dict[str, str]]) -> list[dict]:
        return self.b.task.request_examples(items)

    def __call__(self, examples: list[dict], lengths: bool = False) -> list[dict]:
        """The records action=predict writes for ``examples``, without their ids; ``lengths``: with
        how each text's length was handled (:meth:`lengths`), as the server answers."""
        features, inputs = self.encoded(examples)
        outputs, _ = predict_rows(self.batches, self.b.task, features, inputs, examples)
        return self.records(examples, features, outputs, lengths)

    def records(self, examples: list[dict], features, outputs: list, lengths: bool) -> list[dict]:
        """The decoded outputs as records without ids (abstained where predict.min_confidence says)."""
        task = self.b.task
        flags = abstained(self.b.min_confidence, task, outputs)  # predict.min_confidence, else None
        records = mark(task.prediction_records(outputs, examples), flags)
        records = [{k: v for k, v in r.items() if k != "id"} for r in records]
        if lengths:
            for record, note in zip(records, self.lengths(features, examples)):
                record.update(note)
        return records

    def encoded(self, examples: list[dict]):
        """The examples' features (what decoding reads) and the model's inputs among them."""
        features = self.b.task.encode(examples, self.b.tokenizer, self.b.settings)
        return features, features.select_columns(self.b.task.model_columns(features))

    def answer(self, examples: list[dict]) -> list[dict]:
        """The server's answers: the records with ``truncated`` (or ``windows``)."""
        return self(examples, lengths=True)

    # ---- the answer in three stages (the micro-batcher's) ----
    def prepare(self, examples: list[dict]) -> Prepared:
        """Encoded, sorted by length, cut into model calls and padded: all but the forward."""
        from tasks.collate import in_order, length_order

        runner = self.batches
        features, inputs = self.encoded(examples)
        order = length_order(features)
        rows = in_order(inputs, order)
        # the cuts of BatchPredictor.predict (heads/model/inference.py): rows, or rows × padded length within the budget
        sizes = row_sizes(rows) if runner.batch_tokens else [(1, 1)] * len(rows)
        cuts = token_batches(sizes, runner.batch_tokens, runner.batch_size, getattr(runner.collator, "multiple", 1))
        calls = [runner.collator([rows[i] for i in cut]) for cut in cuts]
        return Prepared(examples, features, order, calls, [padded_tokens(c) for c in calls])

    def sizes(self, examples: list[dict]) -> list[tuple[int, int]]:
        """Each example's (rows, padded length) for joining requests by tokens, from the tokenizer alone
        (a request's own encoding costs ~4 ms, its tokens ~0.05 ms): its fields' tokens and the special
        tokens, cut at max_length and rounded up as the collator pads; a text read as windows
        (task.long_text=windows, QA's contexts) a row per max_length tokens. Exact for single and
        pair texts, an estimate for windows and words: :meth:`prepare` still keeps every call within
        ``predict.batch_tokens``."""
        task, tokenizer = self.b.task, self.b.tokenizer
        max_length = int(self.b.settings.max_length)
        multiple = max(1, getattr(self.batches.collator, "multiple", 1))
        totals = [tokenizer.num_special_tokens_to_add(pair=len(self.fields) > 1)] * len(examples)
        for name in self.fields:  # NER's examples hold units, not their text
            texts = [ex[name] if name in ex else task.text(ex) for ex in examples]
            counted = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            totals = [total + len(ids) for total, ids in zip(totals, counted)]
        windows = "context" in self.fields or getattr(task, "windows", None) is not None
        return [(-(-total // max_length) if windows else 1, -(-min(total, max_length) // multiple) * multiple)
                for total in totals]

    def compute(self, prepared: Prepared) -> list:
        """The model's outputs of each prepared call (the only stage that runs the model)."""
        return [self.batches.forward(batch) for batch in prepared.calls]

    def finish(self, prepared: Prepared, parts: list) -> list[dict]:
        """The outputs in input order, decoded: the records :meth:`answer` gives."""
        from tasks.collate import restore_order

        predictions = restore_order(concat_padded(parts), prepared.order)
        outputs = self.b.task.decode(predictions, prepared.features, prepared.examples)
        return self.records(prepared.examples, prepared.features, outputs, lengths=True)

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
                "model_file": getattr(model, "file", None), "labels": self.b.task.labels, "fields": list(self.fields),
                **self.batches.inference_report()}
