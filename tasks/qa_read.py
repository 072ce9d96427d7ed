"""Reading QA data: SQuAD-shaped JSON (articles → paragraphs → qas), flat rows (KLUE's hub rows,
JSON/JSONL objects) and their gold answers, each checked against its context; and the training
target a gold answer gives (its character span)."""
from __future__ import annotations

from typing import Any

from kotune.core.errors import DataError


def read_example(path: str, where: str, qa: dict, context: Any, title: Any) -> dict:
    """One question as an example: id, question and context checked, gold answers read and each
    checked against the context (``valid``); ``where`` names the row in messages."""
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
    listed = gold_answers(path, qid, qa.get("answers", []))
    answers = [] if impossible else listed
    for ans in answers:  # checked, never shifted: a mismatch is reported and not trained on
        s, text = ans["answer_start"], ans["text"]
        ans["valid"] = bool(text.strip()) and s >= 0 and context[s:s + len(text)] == text
    return {"id": qid, "question": question, "context": context, "title": title or "",
            "answers": answers, "impossible": bool(impossible), "question_type": qtype,
            "had_answers_but_impossible": bool(impossible) and bool(listed)}


def squad_rows(path: str, articles: list) -> list[tuple[str, dict, Any, Any]]:
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


def gold_answers(path: str, qid: str, raw: Any) -> list[dict]:
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


def target_span(ex: dict) -> tuple[int, int] | None:
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
