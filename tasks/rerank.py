"""``action=rerank``, the text side: read the queries and the candidates, turn a pair model's outputs
into one score per (query, candidate) and rank the candidates by it. The model side (loading a run
directory, an ONNX or a native export, batching) is kotune/actions/rerank.py's.

A pair model's score is its regression value (``task=sts``: the 0-5 similarity), or the probability
of one label of a classifier (``rerank.positive_label``; by default the one label named like a
match: ``duplicate``, ``entailment``, ``1``, ...). Every query is ranked against every candidate.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from kotune.core.errors import ConfigError, DataError
from tasks.embed import read_texts

# label names that say "this pair matches": the default positive label where exactly one is the model's
MATCH_LABELS = ("1", "true", "yes", "positive", "relevant", "match", "matched", "similar", "paraphrase",
                "duplicate", "entailment")
SCORE_DIGITS = 6  # rankings.jsonl: each score, rounded for reading (the order is the unrounded scores')


def refusal(task) -> str | None:
    """Why a task cannot rerank (one line's end), None when it can: a sequence head on text pairs."""
    if task.head != "sequence" or getattr(task, "request_fields", None) != ("text", "text_pair"):
        return ("scores one text or marked spans, not a (query, candidate) pair: rerank with a pair model "
                "(task=sts, task=text_pair, task=nli)")
    if getattr(task, "multi_label", False) or task.cfg.get("multi_label"):
        return "gives a set of labels per pair, not one score: rerank with a regression or a single-label pair model"
    return None


def positive_label(labels: list[str], asked: str | None) -> str:
    """The label whose probability scores a pair: ``asked`` (one of ``labels``), else the one label
    named like a match (MATCH_LABELS); several or none is a ConfigError listing the labels."""
    if asked is not None:
        if str(asked) not in labels:
            raise ConfigError(f"rerank.positive_label={asked} is not a label of the model ({', '.join(labels)})")
        return str(asked)
    found = [label for label in labels if label.lower() in MATCH_LABELS]
    if len(found) != 1:
        raise ConfigError(f"rerank.positive_label=LABEL says which label's probability scores a pair "
                          f"(the model's labels: {', '.join(labels)})")
    return found[0]


def pair_scores(logits: Any, labels: list[str] | None, positive: str | None) -> list[float]:
    """One score per row of the model's outputs: the regression value (``labels`` None), else the
    softmax probability of ``positive`` (as the task's decoding computes it, unrounded)."""
    values = np.asarray(logits, dtype=np.float64)
    values = values.reshape(len(values), -1)
    if labels is None:
        return [float(v) for v in values[:, 0]]
    probs = np.exp(values - values.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return [float(p) for p in probs[:, labels.index(positive)]]


def read_queries(query: str | None, path: str | None, column: str | None, quoting: str = "auto") -> list[dict]:
    """``{"row", "text"}`` per query: ``rerank.query`` (one text; row ``query``) or the file ``path``
    (.txt: a query per line; CSV/TSV/JSON/JSONL: ``column``, default ``query``, else ``text``)."""
    if (query is None) == (path is None):
        raise ConfigError("action=rerank needs one of rerank.query=TEXT (one query) or rerank.queries=FILE")
    if query is not None:
        if not isinstance(query, str) or not query.strip():
            raise ConfigError(f"rerank.query: empty or non-text value {query!r}")
        return [{"row": "query", "text": query}]
    return rows_of(path, column, "rerank.query_column", ("query", "text"), quoting)


def read_candidates(path: str | None, column: str | None, quoting: str = "auto") -> list[dict]:
    """``{"row", "text"}`` per candidate of ``path`` (.txt: one per line; else ``column``, default
    ``text``, else ``candidate``, else the conventional ``sentence``/``document``)."""
    if path is None:
        raise ConfigError("action=rerank needs rerank.candidates=FILE (.txt, one candidate per line, or "
                          "CSV/TSV/JSON/JSONL with rerank.candidate_column)")
    return rows_of(path, column, "rerank.candidate_column", ("text", "candidate"), quoting)


def rows_of(path: str, column: str | None, option: str, defaults: tuple[str, ...], quoting: str) -> list[dict]:
    """The texts of ``path`` as tasks/embed.py reads them (each row checked: one line naming file and row)."""
    from tasks.io import column_names, read_records

    if column is None and not path.lower().endswith(".txt"):
        if not os.path.isfile(path):
            raise DataError(path, None, "file not found")
        present = column_names(read_records(path, None, quoting))
        column = next((name for name in defaults if name in present), None)
    return [{"row": where, "text": text}
            for where, text in read_texts(path, column, None, quoting, option=option, default=defaults[0])]


def ranking(query: dict, candidates: list[dict], scores: list[float], top_k: int | None) -> dict:
    """One query's record: its candidates best first (ties: file order), ``top_k`` of them (None: all)."""
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])  # stable: equal scores keep file order
    kept = order if top_k is None else order[: int(top_k)]
    return {"query_row": query["row"], "query": query["text"],
            "ranked": [{"rank": rank, "row": candidates[i]["row"], "text": candidates[i]["text"],
                        "score": round(scores[i], SCORE_DIGITS)} for rank, i in enumerate(kept, 1)]}


def check_top_k(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"rerank.top_k={value}: a whole number ≥ 1 (or null: every candidate)")
    return value
