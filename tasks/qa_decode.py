"""QA decoding: span logits of every window → the n-best answers of each question, with the null
answer where the task allows one; and the pipeline ceiling's pieces (gold answers as synthetic
logits through the same decoding, and where each gold answer was lost)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kotune.core.errors import KotuneError
from tasks.base import IGNORE, Task
from tasks.qa_read import target_span

HIGH, LOW = 1.0e3, -1.0e3  # synthetic logits of the ceiling: gold vs everything else


# ---- decoding ----------------------------------------------------------------------------
def span_candidates(predictions, features, examples: list[dict], decode_mode: str, n_best: int,
                    max_answer_length: int) -> tuple[list[dict[tuple[int, int], float]], list[float]]:
    """Per question, each character span's best score over all its windows (the ``n_best`` starts ×
    ends of a window, at most ``max_answer_length`` tokens long), and its null score (the lowest
    [CLS] score over its windows)."""
    if not isinstance(predictions, (tuple, list)) or len(predictions) < 2:
        raise KotuneError("QA decoding expects (start logits, end logits) from the span head")
    start_logits, end_logits = np.asarray(predictions[0]), np.asarray(predictions[1])
    char = decode_mode == "char"
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
                          f"with another task.decode (now '{decode_mode}')?")
    candidates: list[dict[tuple[int, int], float]] = [{} for _ in examples]
    null_score = [math.inf] * len(examples)
    n = n_best
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
        ok = (ee >= ss) & (span_tokens <= max_answer_length)
        scores = s[ss] + e[ee]
        best = candidates[ex_i]
        for a, b, score in zip(ss[ok].tolist(), ee[ok].tolist(), scores[ok].tolist()):
            span = (int(pos[a]), int(pos[b]) + 1) if char else (int(t_start[a]), int(t_end[b]))
            if span[1] <= span[0] or span[1] > len(context):
                continue
            if score > best.get(span, -math.inf):  # the same span seen from overlapping windows
                best[span] = score
    return candidates, null_score


def choose_answer(ex: dict, spans: dict[tuple[int, int], float], null_score: float, allow_null: bool,
                  n_best: int, null_threshold: float) -> dict:
    """A question's answer, n-best list (with probabilities) and null score difference."""
    ranked = sorted(spans.items(), key=lambda kv: -kv[1])[: n_best]
    nbest = [{"text": ex["context"][s:e], "start": s, "end": e, "score": score} for (s, e), score in ranked]
    out: dict[str, Any] = {"answer": "", "start": None}
    if allow_null:
        best = nbest[0]["score"] if nbest else -math.inf
        out["null_score_diff"] = (null_score - best) if nbest and math.isfinite(null_score) else None
        if nbest and not null_score - best > null_threshold:
            out.update(answer=nbest[0]["text"], start=nbest[0]["start"])
        nbest = nbest + [{"text": "", "start": None, "end": None, "score": null_score}]
        nbest.sort(key=lambda c: -c["score"])
        nbest = nbest[: n_best]
    elif nbest:
        out.update(answer=nbest[0]["text"], start=nbest[0]["start"])
    if nbest:  # probabilities over the n-best list, as the SQuAD n-best files give them
        top = max(c["score"] for c in nbest)
        weights = [math.exp(c["score"] - top) for c in nbest]
        for c, w in zip(nbest, weights):
            c["probability"] = w / sum(weights)
    out["nbest"] = nbest
    return out


# ---- pipeline ceiling --------------------------------------------------------------------
@dataclass
class CeilingWindows:
    """What the ceiling reads of the encoded windows: each window's training target (start, end
    slot), its question, its tokens' character offsets and, with char decoding, each slot's token."""

    char: bool
    targets: list[tuple[int, int]]
    example_index: list[int]
    token_start: list[list[int]]
    token_end: list[list[int]]
    token_of: list[list[int]] | None

    @classmethod
    def of(cls, features, char: bool) -> CeilingWindows:
        targets = list(zip(features["start_positions"], features["end_positions"]))
        example_index = list(features["example_index"])
        token_start, token_end = list(features["token_start"]), list(features["token_end"])
        token_of = list(features["char_token_index"]) if char else None
        return cls(char, targets, example_index, token_start, token_end, token_of)


def gold_logits(windows: CeilingWindows, max_token_chars: int) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """Synthetic (start, end) logits that make each window's training target (its gold span, or
    [CLS]) the only candidate, and the questions whose char-decoded edge ties with other slots."""
    char, token_of = windows.char, windows.token_of
    lengths = [len(p) for p in (token_of if char else windows.token_start)]
    start, end = (np.full((len(windows.targets), max(lengths)), float(IGNORE)) for _ in range(2))
    clipped = set()
    for i, ((s, e), n) in enumerate(zip(windows.targets, lengths)):
        start[i, :n] = end[i, :n] = LOW
        if s == IGNORE:
            continue
        start[i, s], end[i, e] = HIGH, HIGH
        if char and s > 0:  # the head's offset classes stop at max_token_chars - 1: ties, as a model sees them
            for logits, slot, from_end in ((start, s, False), (end, e, True)):
                tied = tied_slots(token_of[i], slot, from_end, max_token_chars)
                if len(tied) > 1:
                    logits[i, tied] = HIGH
                    clipped.add(windows.example_index[i])
    return start, end, clipped


def tied_slots(token_of: list[int], slot: int, from_end: bool, max_token_chars: int) -> list[int]:
    """Slots of ``slot``'s token that the char head cannot tell apart from it: ranks past
    max_token_chars - 1 (counted from the token's start, or from its end for end edges)."""
    members = [j for j in range(len(token_of)) if token_of[j] == token_of[slot]]
    if len(members) <= max_token_chars:
        return [slot]
    limit = max_token_chars - 1
    cls = lambda j: min(members[-1] - j if from_end else j - members[0], limit)  # noqa: E731
    return [j for j in members if cls(j) == cls(slot)]


@dataclass
class AnswerFates:
    """Where the gold answers went (question indices): inside a window, longer than
    ``max_answer_length``, with an edge inside a token, without a valid gold offset, lost to the
    windows; and how many decoded strings equal the gold inside the windows."""

    in_window: set[int] = field(default_factory=set)
    too_long: set[int] = field(default_factory=set)
    edge_inside: set[int] = field(default_factory=set)
    answerable: list[int] = field(default_factory=list)
    targetless: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    exact: int = 0


def answer_fates(windows: CeilingWindows, examples: list[dict], outputs: list[dict],
                 max_answer_length: int) -> AnswerFates:
    """Each answerable question's gold answer: in which window, if any, it can be decoded."""
    fates = AnswerFates()
    in_window, too_long, edge_inside = fates.in_window, fates.too_long, fates.edge_inside
    for i, (s, e) in enumerate(windows.targets):
        if s in (IGNORE, 0):
            continue
        k = windows.example_index[i]
        first_tok, last_tok = (windows.token_of[i][s], windows.token_of[i][e]) if windows.char else (s, e)
        if last_tok - first_tok + 1 > max_answer_length:
            too_long.add(k)
            continue
        in_window.add(k)
        span = target_span(examples[k])
        if span[0] != windows.token_start[i][first_tok] or span[1] != windows.token_end[i][last_tok]:
            edge_inside.add(k)
    too_long -= in_window
    fates.answerable = [k for k, ex in enumerate(examples) if not ex["impossible"] and ex["labeled"]]
    fates.targetless = [k for k in fates.answerable if target_span(examples[k]) is None]
    fates.lost = [k for k in fates.answerable if k not in in_window and k not in too_long and k not in fates.targetless]
    fates.exact = sum(outputs[k]["answer"] == examples[k]["context"][slice(*target_span(examples[k]))]
                      for k in in_window)
    return fates


def ceiling_report(task: Task, windows: CeilingWindows, fates: AnswerFates, clipped: set[int],
                   examples: list[dict], result: dict, inside_scores: dict) -> dict:
    """The ceiling's report of a QA task (``task``: its decode settings): counts and lines."""
    char, targets, example_index = windows.char, windows.targets, windows.example_index
    answerable, in_window, too_long = fates.answerable, fates.in_window, fates.too_long
    lost, targetless, edge_inside, exact = fates.lost, fates.targetless, fates.edge_inside, fates.exact
    n = len(examples)
    report = {
        "decode": task.decode_mode, "doc_stride": task.doc_stride, "max_answer_length": task.max_answer_length,
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
                     f"{len(clipped)} past max_token_chars={task.max_token_chars})")
    else:
        edge_note = f"{len(edge_inside)} with an edge inside a token (token decoding returns whole tokens)"
    report["lines"] = [
        f"ceiling ({task.decode_mode} decoding): {n} questions ({len(answerable)} answerable), "
        f"{len(targets)} windows (at most {report['max_windows_per_question']} per question)",
        f"answers lost to windows: {len(lost)}; longer than max_answer_length={task.max_answer_length} "
        f"tokens: {len(too_long)}; without a valid gold offset: {len(targetless)}",
        f"answers inside windows: {len(in_window)}, {edge_note}; decoded string == gold: {exact}",
        "metrics: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()),
        "metrics on questions inside windows: " + ", ".join(f"{k} {v:.3f}" for k, v in inside_scores.items()),
    ]
    return report
