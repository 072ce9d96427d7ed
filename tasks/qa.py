"""Extractive question answering: KLUE MRC (``mrc``), KorQuAD 1.0 (``korquad``) and any SQuAD
v1/v2 file (``qa``).

read (hub rows, KLUE's MRC JSON, SQuAD JSON, flat JSON/JSONL rows; every gold answer checked:
``context[s:s+len(text)] == text``) → windows (question + a slice of the context; consecutive
slices share ``doc_stride`` tokens) → span head (heads/span.py) → n-best over all windows of a
question, with the null answer where the task allows one → KorQuAD 1.0 / KLUE-MRC metrics.

``task.decode``: ``token`` (answer edges are token edges; head ``span``) or ``char`` (answer edges
are characters inside the edge tokens; head ``span_char``). Example ids, offsets and the window →
question map stay in non-model columns of the features and never reach the model.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks import metric_sets
from tasks.base import IGNORE, MODEL_INPUTS, EncodeSettings, Task
from kotune.core.errors import ConfigError, DataError, KotuneError
from kotune.core.log import warn
from tasks.io import read_json, read_records
from kotune.core.files import write_json_atomic

HIGH, LOW = 1.0e3, -1.0e3  # synthetic logits of the ceiling: gold vs everything else
CHAR_INPUTS = ("char_token_index", "char_in_token")
DECODE_ONLY = ("n_best", "max_answer_length", "null_threshold", "write_nbest", "metric",
               "main_metric", "greater_is_better", "max_length")  # max_length reaches encode via settings
SHOW_IDS = 5


def _some(ids: list[str]) -> str:
    return ", ".join(ids[:SHOW_IDS]) + (f" … (+{len(ids) - SHOW_IDS})" if len(ids) > SHOW_IDS else "")


@register_task("mrc", "korquad", "qa")
class QATask(Task):
    """Extractive QA over SQuAD-shaped data; see the module docstring."""

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
            rows = _squad_rows(path, data["data"])
        else:  # flat rows: one question per JSON object / JSONL line, hub-like fields
            rows = [(where, row, row.get("context"), row.get("title")) for where, row in read_records(path, self.reading.format, self.reading.quoting)]
        return self._check(path, [self._example(path, where, qa, context, title)
                                  for where, qa, context, title in rows])

    def read_hub(self, rows, path: str) -> list[dict]:
        return self._check(path, [self._example(path, f"row {i}", row, row.get("context"), row.get("title"))
                                  for i, row in enumerate(rows)])

    def _example(self, path: str, where: str, qa: dict, context: Any, title: Any) -> dict:
        qid = qa.get("id", qa.get("guid"))
        if qid is None or str(qid) == "":
            raise DataError(path, where, f"missing field 'id' (or 'guid') (row has: {', '.join(sorted(qa))})")
        qid = str(qid)
        question = qa.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DataError(path, qid, f"empty or missing question {question!r}")
        if not isinstance(context, str) or not context.strip():
            raise DataError(path, qid, f"empty or missing context {context!r}")
        impossible = qa.get("is_impossible", False)
        if not isinstance(impossible, (bool, int)) or impossible not in (0, 1):
            raise DataError(path, qid, f"is_impossible must be true or false, got {impossible!r}")
        qtype = qa.get("question_type")
        if qtype is not None and (isinstance(qtype, bool) or not isinstance(qtype, int)):
            raise DataError(path, qid, f"question_type must be an integer, got {qtype!r}")
        # KLUE's MRC JSON: `plausible_answers` of unanswerable questions are never gold
        listed = _answers(path, qid, qa.get("answers", []))
        answers = [] if impossible else listed
        for ans in answers:  # checked, never shifted: a mismatch is reported and not trained on
            s, text = ans["answer_start"], ans["text"]
            ans["valid"] = bool(text.strip()) and s >= 0 and context[s:s + len(text)] == text
        return {"id": qid, "question": question, "context": context, "title": title or "",
                "answers": answers, "impossible": bool(impossible), "question_type": qtype,
                "had_answers_but_impossible": bool(impossible) and bool(listed)}

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
        return self._check(source, [self._example(source, f"item {i}", {"id": f"item {i}", "question": item.get("question")},
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
        """n-best spans per question over all its windows; the null answer ("") when allowed
        and ``min null score - best span score > null_threshold`` (SQuAD v2's rule)."""
        if not isinstance(predictions, (tuple, list)) or len(predictions) < 2:
            raise KotuneError("QA decoding expects (start logits, end logits) from the span head")
        start_logits, end_logits = np.asarray(predictions[0]), np.asarray(predictions[1])
        char = self.decode_mode == "char"
        example_index = list(features["example_index"])
        if char:
            positions = list(features["char_position"])
            token_of = list(features["char_token_index"])
        else:
            positions = list(zip(features["token_start"], features["token_end"]))
        width = max((len(p) if char else len(p[0])) for p in positions)
        if start_logits.shape[0] != len(example_index) or start_logits.shape[1] < width:
            raise KotuneError(f"predictions have shape {start_logits.shape} but the features need "
                              f"{len(example_index)} rows of up to {width} positions: was the model trained "
                              f"with another task.decode (now '{self.decode_mode}')?")
        candidates: list[dict[tuple[int, int], float]] = [{} for _ in examples]
        null_score = [math.inf] * len(examples)
        n = self.n_best
        for i, ex_i in enumerate(example_index):
            context = examples[ex_i]["context"]
            if char:
                pos = np.asarray(positions[i])
                tok = np.asarray(token_of[i])
                usable = pos >= 0
            else:
                t_start, t_end = np.asarray(positions[i][0]), np.asarray(positions[i][1])
                usable = t_start >= 0
            length = len(usable)
            s, e = start_logits[i, :length].astype(np.float64), end_logits[i, :length].astype(np.float64)
            null_score[ex_i] = min(null_score[ex_i], s[0] + e[0])
            where = np.flatnonzero(usable)
            if where.size == 0:
                continue
            top_s = where[np.argsort(-s[where], kind="stable")[:n]]
            top_e = where[np.argsort(-e[where], kind="stable")[:n]]
            ss, ee = np.meshgrid(top_s, top_e, indexing="ij")
            if char:
                span_tokens = tok[ee] - tok[ss] + 1
            else:
                span_tokens = ee - ss + 1
            ok = (ee >= ss) & (span_tokens <= self.max_answer_length)
            scores = s[ss] + e[ee]
            best = candidates[ex_i]
            for a, b, score in zip(ss[ok].tolist(), ee[ok].tolist(), scores[ok].tolist()):
                span = (int(pos[a]), int(pos[b]) + 1) if char else (int(t_start[a]), int(t_end[b]))
                if span[1] <= span[0] or span[1] > len(context):
                    continue
                if score > best.get(span, -math.inf):  # the same span seen from overlapping windows
                    best[span] = score
        allow_null = self._null_allowed(examples)
        return [self._choose(ex, candidates[k], null_score[k], allow_null) for k, ex in enumerate(examples)]

    def _choose(self, ex: dict, spans: dict[tuple[int, int], float], null_score: float, allow_null: bool) -> dict:
        ranked = sorted(spans.items(), key=lambda kv: -kv[1])[: self.n_best]
        nbest = [{"text": ex["context"][s:e], "start": s, "end": e, "score": score} for (s, e), score in ranked]
        out: dict[str, Any] = {"answer": "", "start": None}
        if allow_null:
            best = nbest[0]["score"] if nbest else -math.inf
            out["null_score_diff"] = (null_score - best) if nbest and math.isfinite(null_score) else None
            if nbest and not null_score - best > self.null_threshold:
                out.update(answer=nbest[0]["text"], start=nbest[0]["start"])
            nbest = nbest + [{"text": "", "start": None, "end": None, "score": null_score}]
            nbest.sort(key=lambda c: -c["score"])
            nbest = nbest[: self.n_best]
        elif nbest:
            out.update(answer=nbest[0]["text"], start=nbest[0]["start"])
        if nbest:  # probabilities over the n-best list, as the SQuAD n-best files give them
            top = max(c["score"] for c in nbest)
            weights = [math.exp(c["score"] - top) for c in nbest]
            for c, w in zip(nbest, weights):
                c["probability"] = w / sum(weights)
        out["nbest"] = nbest
        return out

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
        edges this decoding cannot express."""
        targets = list(zip(features["start_positions"], features["end_positions"]))
        example_index = list(features["example_index"])
        char = self.decode_mode == "char"
        token_start, token_end = list(features["token_start"]), list(features["token_end"])
        token_of = list(features["char_token_index"]) if char else None
        lengths = [len(p) for p in (token_of if char else token_start)]
        start, end = (np.full((len(targets), max(lengths)), float(IGNORE)) for _ in range(2))
        clipped = set()
        for i, ((s, e), n) in enumerate(zip(targets, lengths)):
            start[i, :n] = end[i, :n] = LOW
            if s == IGNORE:
                continue
            start[i, s], end[i, e] = HIGH, HIGH
            if char and s > 0:  # the head's offset classes stop at max_token_chars - 1: ties, as a model sees them
                for logits, slot, from_end in ((start, s, False), (end, e, True)):
                    tied = self._tied_slots(token_of[i], slot, from_end)
                    if len(tied) > 1:
                        logits[i, tied] = HIGH
                        clipped.add(example_index[i])
        outputs = self.decode((start, end), features, examples)

        in_window, too_long, edge_inside = set(), set(), set()
        for i, (s, e) in enumerate(targets):
            if s in (IGNORE, 0):
                continue
            k = example_index[i]
            first_tok, last_tok = (token_of[i][s], token_of[i][e]) if char else (s, e)
            if last_tok - first_tok + 1 > self.max_answer_length:
                too_long.add(k)
                continue
            in_window.add(k)
            span = _target_span(examples[k])
            if span[0] != token_start[i][first_tok] or span[1] != token_end[i][last_tok]:
                edge_inside.add(k)
        too_long -= in_window
        answerable = [k for k, ex in enumerate(examples) if not ex["impossible"] and ex["labeled"]]
        targetless = [k for k in answerable if _target_span(examples[k]) is None]
        lost = [k for k in answerable if k not in in_window and k not in too_long and k not in targetless]
        exact = sum(outputs[k]["answer"] == examples[k]["context"][slice(*_target_span(examples[k]))]
                    for k in in_window)
        result = self.score(outputs, examples)
        inside = sorted(in_window | {k for k, ex in enumerate(examples) if ex["impossible"]})
        inside_scores = self.score([outputs[k] for k in inside], [examples[k] for k in inside]) if inside else {}
        n = len(examples)
        report = {
            "decode": self.decode_mode, "doc_stride": self.doc_stride, "max_answer_length": self.max_answer_length,
            "questions": n, "answerable": len(answerable), "unanswerable": n - len(answerable),
            "windows": len(targets), "max_windows_per_question": max(Counter(example_index).values()),
            "answers_without_valid_target": len(targetless),
            "answers_lost_to_windows": len(lost),
            "answers_over_max_answer_length": len(too_long),
            "answers_in_windows": len(in_window),
            "answers_with_edge_inside_token": len(edge_inside),
            "answers_with_edge_past_max_token_chars": len(clipped) if char else None,
            "exact_string_in_windows": exact,
            "metrics_in_windows": inside_scores,
            "lost_ids": [examples[k]["id"] for k in lost][:20],
        }
        if char:
            edge_note = (f"{len(edge_inside)} with an edge inside a token (decoded to the character; "
                         f"{len(clipped)} past max_token_chars={self.max_token_chars})")
        else:
            edge_note = f"{len(edge_inside)} with an edge inside a token (token decoding returns whole tokens)"
        report["lines"] = [
            f"ceiling ({self.decode_mode} decoding): {n} questions ({len(answerable)} answerable), "
            f"{len(targets)} windows (at most {report['max_windows_per_question']} per question)",
            f"answers lost to windows: {len(lost)}; longer than max_answer_length={self.max_answer_length} "
            f"tokens: {len(too_long)}; without a valid gold offset: {len(targetless)}",
            f"answers inside windows: {len(in_window)}, {edge_note}; decoded string == gold: {exact}",
            "metrics: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()),
            "metrics on questions inside windows: " + ", ".join(f"{k} {v:.3f}" for k, v in inside_scores.items()),
        ]
        return result, report

    def _tied_slots(self, token_of: list[int], slot: int, from_end: bool) -> list[int]:
        """Slots of ``slot``'s token that the char head cannot tell apart from it: ranks past
        max_token_chars - 1 (counted from the token's start, or from its end for end edges)."""
        members = [j for j in range(len(token_of)) if token_of[j] == token_of[slot]]
        if len(members) <= self.max_token_chars:
            return [slot]
        limit = self.max_token_chars - 1
        cls = lambda j: min(members[-1] - j if from_end else j - members[0], limit)  # noqa: E731
        return [j for j in members if cls(j) == cls(slot)]


# ---- helpers (plain data) ----------------------------------------------------------------
def _squad_rows(path: str, articles: list) -> list[tuple[str, dict, Any, Any]]:
    rows = []
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs")
        if not isinstance(paragraphs, list):
            raise DataError(path, f"data[{a}]", "'paragraphs' must be a list")
        for p, paragraph in enumerate(paragraphs):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise DataError(path, f"data[{a}].paragraphs[{p}]", "missing field 'qas' (a list)")
            for q, qa in enumerate(paragraph["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict):
                    raise DataError(path, where, f"expected an object, got {type(qa).__name__}")
                rows.append((where, qa, paragraph.get("context"), article.get("title")))
    return rows


def _answers(path: str, qid: str, raw: Any) -> list[dict]:
    """Gold answers from a SQuAD list of {text, answer_start} or the hub's {text: [], answer_start: []}."""
    if isinstance(raw, dict):  # hub: columns of lists
        texts, starts = raw.get("text"), raw.get("answer_start")
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise DataError(path, qid, "answers must hold lists 'text' and 'answer_start' of equal length")
        raw = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
    if not isinstance(raw, list):
        raise DataError(path, qid, f"answers must be a list, got {type(raw).__name__}")
    out = []
    for j, ans in enumerate(raw):
        if not isinstance(ans, dict) or "text" not in ans or "answer_start" not in ans:
            raise DataError(path, qid, f"answer {j}: missing field 'text' or 'answer_start'")
        text, start = ans["text"], ans["answer_start"]
        if not isinstance(text, str):
            raise DataError(path, qid, f"answer {j}: text must be a string, got {text!r}")
        if isinstance(start, bool) or not isinstance(start, int):
            raise DataError(path, qid, f"answer {j}: answer_start must be an integer, got {start!r}")
        out.append({"text": text, "answer_start": start})
    return out


def _target_span(ex: dict) -> tuple[int, int] | None:
    """The training target: the first valid gold answer as a character span, whitespace at its
    edges left out (no token and no decoding ever produces an edge space)."""
    for ans in ex["answers"]:
        if ans["valid"]:
            s, e = ans["answer_start"], ans["answer_start"] + len(ans["text"])
            while s < e and ex["context"][s].isspace():
                s += 1
            while e > s and ex["context"][e - 1].isspace():
                e -= 1
            return s, e
    return None


def _token_target(ex: dict, starts: list[int], ends: list[int]) -> tuple[int, int]:
    """(start token, end token) of the answer in this window; (0, 0) ([CLS]) for unanswerable
    questions and windows that do not hold the whole answer; -100 when there is no usable
    target (no valid gold offset, unlabeled data, or an answer no token covers)."""
    if not ex["labeled"]:
        return IGNORE, IGNORE
    if ex["impossible"]:
        return 0, 0
    span = _target_span(ex)
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
    s, e = _target_span(ex)
    first = next((j for j in range(1, len(positions)) if positions[j] >= s), None)
    last = next((j for j in range(len(positions) - 1, 0, -1) if positions[j] < e), None)
    if first is None or last is None or last < first:
        return IGNORE, IGNORE
    return first, last
