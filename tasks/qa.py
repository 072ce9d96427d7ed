"""Extractive question answering: KLUE MRC (``mrc``), KorQuAD 1.0 (``korquad``) and any SQuAD
v1/v2 file (``qa``).

read (hub rows, KLUE's MRC JSON, SQuAD JSON, flat JSON/JSONL rows; every gold answer checked:
``context[s:s+len(text)] == text``) → windows (question + a slice of the context; consecutive
slices share ``doc_stride`` tokens) → span head (heads/span.py) → n-best over all windows of a
question, with the null answer where the task allows one → KorQuAD 1.0 / KLUE-MRC metrics.

``task.decode``: ``token`` (answer edges are token edges; head ``span``) or ``char`` (answer edges
are characters inside the edge tokens; head ``span_char``). Example ids, offsets and the window →
question map stay in non-model columns of the features and never reach the model.

Here: the task (reading checks, windows, scoring); tasks/qa_read.py reads the files and rows;
tasks/qa_decode.py decodes windows' logits into answers and holds the ceiling's pieces.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from kotune.core.registry import register_task
from tasks import metric_sets
from tasks.base import IGNORE, MODEL_INPUTS, EncodeSettings, Task
from kotune.core.errors import ConfigError, DataError, KotuneError
from kotune.core.log import warn
from tasks.io import read_json, read_records
from kotune.core.files import write_json_atomic
from tasks.qa_decode import (CeilingWindows, answer_fates, ceiling_report, choose_answer, gold_logits,
                             span_candidates)
from tasks.qa_read import read_example, squad_rows, target_span

CHAR_INPUTS = ("char_token_index", "char_in_token")
DECODE_ONLY = ("n_best", "max_answer_length", "null_threshold", "write_nbest", "metric",
               "main_metric", "greater_is_better", "max_length")  # max_length reaches encode via settings
SHOW_IDS = 5


def _some(ids: list[str]) -> str:
    return ", ".join(ids[:SHOW_IDS]) + (f" … (+{len(ids) - SHOW_IDS})" if len(ids) > SHOW_IDS else "")


@register_task("mrc", "korquad", "qa")
class QATask(Task):
    """Extractive QA over SQuAD-shaped data; see the module docstring."""

    def abstention_refusal(self) -> str | None:  # predict.min_confidence (tasks/abstention.py)
        return "extracts an answer span: its start and end scores are not one class probability"

    head = "span"
    label_fields = ("start_positions", "end_positions")

    # decode picks the head; the window layout is what the model learned to read
    # and null answers as the training data had them (task.null_answers=auto) decode any other file
    saved_options = {"decode": "error", "doc_stride": "saved", "max_question_length": "saved", "null_answers": "auto"}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.decode_mode = str(cfg.get("decode", "token"))
        if self.decode_mode not in ("token", "char"):
            raise ConfigError(f"task.decode must be token or char, got '{self.decode_mode}'")
        self.doc_stride = int(cfg.get("doc_stride", 128))
        self.max_question_length = int(cfg.get("max_question_length", 64))
        self.n_best = int(cfg.get("n_best", 20))
        self.max_answer_length = int(cfg.get("max_answer_length", 30))
        self.null_threshold = float(cfg.get("null_threshold", 0.0))
        self.max_token_chars = int(cfg.get("max_token_chars", 32))
        null = cfg.get("null_answers", "auto")
        self.allow_null: bool | None = None if null in (None, "auto") else bool(null)
        self.metric = str(cfg.get("metric", "auto"))
        if self.metric not in ("auto", "korquad", "klue_mrc"):
            raise ConfigError(f"task.metric must be korquad, klue_mrc or auto, got '{self.metric}'")
        for key, value in (("doc_stride", self.doc_stride), ("n_best", self.n_best),
                           ("max_answer_length", self.max_answer_length),
                           ("max_question_length", self.max_question_length),
                           ("max_token_chars", self.max_token_chars)):
            if value < (0 if key == "doc_stride" else 1):
                raise ConfigError(f"task.{key} must be positive, got {value}")

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        data = read_json(path) if path.lower().endswith(".json") else None
        if isinstance(data, dict) and isinstance(data.get("data"), list) and \
                all(isinstance(a, dict) and "paragraphs" in a for a in data["data"]):
            rows = squad_rows(path, data["data"])
        else:  # flat rows: one question per JSON object / JSONL line, hub-like fields
            rows = [(where, row, row.get("context"), row.get("title")) for where, row in read_records(path, self.reading.format, self.reading.quoting)]
        return self._check(path, [read_example(path, where, qa, context, title)
                                  for where, qa, context, title in rows])

    def read_hub(self, rows, path: str) -> list[dict]:
        return self._check(path, [read_example(path, f"row {i}", row, row.get("context"), row.get("title"))
                                  for i, row in enumerate(rows)])

    def _check(self, path: str, examples: list[dict]) -> list[dict]:
        """File-level checks: unique ids, labels present, null answers allowed, answers matching."""
        seen: set[str] = set()
        for ex in examples:
            if ex["id"] in seen:
                raise DataError(path, ex["id"], "duplicate question id (predictions are keyed by id)")
            seen.add(ex["id"])
        labeled = any(ex["answers"] or ex["impossible"] for ex in examples)
        for ex in examples:
            ex["labeled"] = labeled
            if labeled and not ex["answers"] and not ex["impossible"]:
                raise DataError(path, ex["id"], "answerable question (is_impossible is false) without answers")
            if ex["impossible"] and self.allow_null is False:
                raise DataError(path, ex["id"], f"unanswerable question, but task {self.name} takes no null "
                                                "answers (KorQuAD 1.0 has none): use task=mrc or task=qa")
        odd = [ex["id"] for ex in examples if ex.pop("had_answers_but_impossible")]
        if odd:
            warn(f"{path}: {len(odd)} question(s) marked is_impossible also list answers; treated as "
                 f"unanswerable: {_some(odd)}")
        bad = [ex["id"] for ex in examples for a in ex["answers"] if not a["valid"]]
        if bad:
            unusable = [ex["id"] for ex in examples if ex["answers"] and not any(a["valid"] for a in ex["answers"])]
            warn(f"{path}: {len(bad)} gold answer(s) do not match their context (context[s:s+len(text)] "
                 f"!= text), never used as training targets ({len(unusable)} question(s) left without "
                 f"one; their text still counts as gold for scoring): {_some(bad)}")
        return examples

    @property
    def request_fields(self) -> tuple[str, ...]:
        return ("question", "context")

    def request_examples(self, items: list[dict[str, str]], source: str = "request") -> list[dict]:
        return self._check(source, [read_example(source, f"item {i}", {"id": f"item {i}", "question": item.get("question")},
                                                 item.get("context"), None) for i, item in enumerate(items)])

    def fit_labels(self, train: list[dict]) -> None:
        if not any(ex["labeled"] for ex in train):
            raise KotuneError("the training split has no gold answers")
        if self.allow_null is None:  # task.null_answers: auto → as the training data has them
            self.allow_null = any(ex["impossible"] for ex in train)
            self.cfg.null_answers = self.allow_null  # saved with the model (saved_options)

    def holdout_group(self, example: dict) -> str | None:
        """Questions on the same passage split together (the passage is what a reader learns)."""
        return example["context"]

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        yield from dict.fromkeys(ex["context"] for ex in examples)
        for ex in examples:
            yield ex["question"]

    def head_options(self) -> dict:
        """The span head per character with task.decode=char."""
        return {"units": "char"} if self.decode_mode == "char" else {}

    def head_kwargs(self) -> dict:
        return {**self.head_options(), "max_token_chars": self.max_token_chars} if self.decode_mode == "char" else {}

    def outputs_from_predictions(self, values: list[Any], examples: list[dict], path: str) -> list[dict]:
        """An answer string per question (the official prediction file's values)."""
        return [{"answer": "" if v is None else str(v)} for v in values]

    def model_columns(self, features) -> list[str]:
        keep = set(MODEL_INPUTS) | set(self.label_fields) | (set(CHAR_INPUTS) if self.decode_mode == "char" else set())
        return [c for c in features.column_names if c in keep]

    def encode_key(self) -> dict:
        return {k: v for k, v in super().encode_key().items() if k not in DECODE_ONLY}

    def describe(self) -> dict:
        return dict(super().describe(), decode=self.decode_mode, doc_stride=self.doc_stride,
                    null_answers=self.allow_null)

    # ---- windows -------------------------------------------------------------------------
    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError("QA needs a fast tokenizer (character offsets); this one is "
                              f"{type(tokenizer).__name__}")
        questions = self._truncate_questions(examples, tokenizer)
        longest = max(len(q) for q in tokenizer(questions, add_special_tokens=False)["input_ids"])
        room = settings.max_length - longest - tokenizer.num_special_tokens_to_add(pair=True)
        if room <= self.doc_stride:
            raise ConfigError(f"task.doc_stride={self.doc_stride} must be smaller than the context room of a "
                              f"window ({room} tokens = max_length {settings.max_length} - longest question "
                              f"{longest} - special tokens): lower doc_stride or task.max_question_length")
        cols: dict[str, list] = {k: [] for k in ("input_ids", "attention_mask", "start_positions", "end_positions",
                                                 "example_index", "token_start", "token_end")}
        if settings.token_type_ids:
            cols["token_type_ids"] = []
        if self.decode_mode == "char":
            cols.update({k: [] for k in (*CHAR_INPUTS, "char_position")})
        step = 256
        for first in range(0, len(examples), step):
            part = examples[first:first + step]
            enc = tokenizer(questions[first:first + step], [ex["context"] for ex in part], truncation="only_second",
                            max_length=settings.max_length, stride=self.doc_stride, return_overflowing_tokens=True,
                            return_offsets_mapping=True, return_token_type_ids=settings.token_type_ids)
            for w, local in enumerate(enc["overflow_to_sample_mapping"]):
                ex = part[local]
                seq = enc.sequence_ids(w)
                if enc["input_ids"][w][0] != tokenizer.cls_token_id:
                    raise ConfigError("QA decoding puts the null answer at position 0: this tokenizer does not "
                                      "start sequences with its [CLS] token")
                starts = [s if sid == 1 else -1 for (s, _), sid in zip(enc["offset_mapping"][w], seq)]
                ends = [e if sid == 1 else -1 for (_, e), sid in zip(enc["offset_mapping"][w], seq)]
                for key in ("input_ids", "attention_mask") + (("token_type_ids",) if settings.token_type_ids else ()):
                    cols[key].append(enc[key][w])
                cols["example_index"].append(first + local)
                cols["token_start"].append(starts)
                cols["token_end"].append(ends)
                gold = _token_target(ex, starts, ends)
                if self.decode_mode == "char":
                    slots = _char_slots(starts, ends)
                    cols["char_token_index"].append(slots[0])
                    cols["char_in_token"].append(slots[1])
                    cols["char_position"].append(slots[2])
                    gold = _char_target(ex, gold, slots[2])
                cols["start_positions"].append(gold[0])
                cols["end_positions"].append(gold[1])
        return datasets.Dataset.from_dict(cols)

    def _truncate_questions(self, examples: list[dict], tokenizer) -> list[str]:
        """Questions longer than ``max_question_length`` tokens are cut (at a token edge), as
        KLUE-baseline's max_query_length does; counted and reported."""
        questions = [ex["question"] for ex in examples]
        enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
        cut = []
        for i, offsets in enumerate(enc["offset_mapping"]):
            if len(offsets) > self.max_question_length:
                questions[i] = questions[i][:offsets[self.max_question_length - 1][1]]
                cut.append(examples[i]["id"])
        if cut:
            warn(f"{len(cut)} question(s) longer than task.max_question_length={self.max_question_length} "
                 f"tokens were truncated: {_some(cut)}")
        return questions

    # ---- decoding ------------------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[dict]:
        """n-best spans per question over all its windows (tasks/qa_decode.py); the null answer ("")
        when allowed and ``min null score - best span score > null_threshold`` (SQuAD v2's rule)."""
        candidates, null_score = span_candidates(predictions, features, examples, self.decode_mode, self.n_best,
                                                 self.max_answer_length)
        allow_null = self._null_allowed(examples)
        return [choose_answer(ex, candidates[k], null_score[k], allow_null, self.n_best, self.null_threshold)
                for k, ex in enumerate(examples)]

    def _null_allowed(self, examples: list[dict]) -> bool:
        if self.allow_null is None:  # auto, and no training split seen (eval of a checkpoint)
            return any(ex["impossible"] for ex in examples)
        return self.allow_null
    # ---- scoring -------------------------------------------------------------------------
    def score(self, outputs: list[dict], examples: list[dict]) -> dict[str, float]:
        unlabeled = [ex["id"] for ex in examples if not ex["labeled"]]
        if unlabeled:
            raise KotuneError(f"{len(unlabeled)} evaluation question(s) have no gold answers "
                              f"(e.g. {unlabeled[0]}): nothing to score")
        predictions = {ex["id"]: out["answer"] for out, ex in zip(outputs, examples)}
        golds = {ex["id"]: [a["text"] for a in ex["answers"]] for ex in examples}
        metric = self.metric
        if metric == "auto":
            metric = "klue_mrc" if any(ex["impossible"] for ex in examples) else "korquad"
        if metric == "korquad":
            impossible = [ex["id"] for ex in examples if ex["impossible"]]
            if impossible:
                raise KotuneError(f"the KorQuAD 1.0 metric has no null answers, but {len(impossible)} question(s) "
                                  f"are unanswerable (e.g. {impossible[0]}): set task.metric=klue_mrc")
            return metric_sets.korquad_scores(predictions, golds)
        types = {ex["id"]: ex["question_type"] for ex in examples}
        return metric_sets.klue_mrc_scores(predictions, golds, types if None not in types.values() else None)

    def prediction_records(self, outputs: list[dict], examples: list[dict]) -> list[dict]:
        return [dict({"id": ex["id"], "prediction": out["answer"]},
                     **({"gold": [a["text"] for a in ex["answers"]]} if ex["labeled"] else {}))
                for out, ex in zip(outputs, examples)]

    def write_outputs(self, run_dir: str, outputs: list[dict], examples: list[dict]) -> list[str]:
        """``predictions.json`` ({id: answer}, the file KorQuAD's and SQuAD's scripts read) and,
        with ``task.write_nbest``, ``nbest_predictions.json`` (with ``null_odds.json`` when
        null answers are allowed)."""
        paths = [os.path.join(run_dir, "predictions.json")]
        write_json_atomic(paths[0], {ex["id"]: out["answer"] for out, ex in zip(outputs, examples)})
        if self.cfg.get("write_nbest", False):
            paths.append(os.path.join(run_dir, "nbest_predictions.json"))
            write_json_atomic(paths[-1], {ex["id"]: out["nbest"] for out, ex in zip(outputs, examples)})
            if any("null_score_diff" in out for out in outputs):
                paths.append(os.path.join(run_dir, "null_odds.json"))
                write_json_atomic(paths[-1], {ex["id"]: out.get("null_score_diff")
                                              for out, ex in zip(outputs, examples)})
        return paths

    # ---- pipeline ceiling ----------------------------------------------------------------
    def ceiling(self, features, examples: list[dict]) -> tuple[dict, dict]:
        """Gold answers through the same windows and the same decoding: synthetic logits that
        make the training target of every window (its gold span, or [CLS]) the only
        candidate. What is lost is lost to the windows, to ``max_answer_length``, or to answer
        edges this decoding cannot express (tasks/qa_decode.py)."""
        windows = CeilingWindows.of(features, self.decode_mode == "char")
        start, end, clipped = gold_logits(windows, self.max_token_chars)
        outputs = self.decode((start, end), features, examples)
        fates = answer_fates(windows, examples, outputs, self.max_answer_length)
        result = self.score(outputs, examples)
        inside = sorted(fates.in_window | {k for k, ex in enumerate(examples) if ex["impossible"]})
        inside_scores = self.score([outputs[k] for k in inside], [examples[k] for k in inside]) if inside else {}
        return result, ceiling_report(self, windows, fates, clipped, examples, result, inside_scores)
# ---- helpers (plain data) ----------------------------------------------------------------
def _token_target(ex: dict, starts: list[int], ends: list[int]) -> tuple[int, int]:
    """(start token, end token) of the answer in this window; (0, 0) ([CLS]) for unanswerable
    questions and windows that do not hold the whole answer; -100 when there is no usable
    target (no valid gold offset, unlabeled data, or an answer no token covers)."""
    if not ex["labeled"]:
        return IGNORE, IGNORE
    if ex["impossible"]:
        return 0, 0
    span = target_span(ex)
    if span is None:
        return IGNORE, IGNORE
    context = [k for k, s in enumerate(starts) if s >= 0]
    if not context or starts[context[0]] > span[0] or ends[context[-1]] < span[1]:
        return 0, 0
    first = next((k for k in context if ends[k] > span[0]), None)
    last = next((k for k in reversed(context) if starts[k] < span[1]), None)
    if first is None or last is None or last < first:
        return IGNORE, IGNORE
    return first, last


def _char_slots(starts: list[int], ends: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Character slots of a window: slot 0 is [CLS]; then every context character covered by a
    token, once (a character two tokens share goes to the first): (token index, rank inside that
    token, position in the context)."""
    token_index, rank, position = [0], [0], [-1]
    covered = -1
    for k, (s, e) in enumerate(zip(starts, ends)):
        if s < 0:
            continue
        first = max(s, covered + 1)
        for c in range(first, e):
            token_index.append(k)
            rank.append(c - first)
            position.append(c)
        covered = max(covered, e - 1)
    return token_index, rank, position


def _char_target(ex: dict, token_gold: tuple[int, int], positions: list[int]) -> tuple[int, int]:
    """Slot indices of the answer's first and last characters, from the token-level decision of
    whether this window holds the answer."""
    if token_gold[0] in (IGNORE, 0):
        return token_gold
    s, e = target_span(ex)
    first = next((j for j in range(1, len(positions)) if positions[j] >= s), None)
    last = next((j for j in range(len(positions) - 1, 0, -1) if positions[j] < e), None)
    if first is None or last is None or last < first:
        return IGNORE, IGNORE
    return first, last
