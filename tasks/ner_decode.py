"""Token tagging's decode: logits at the label slots → one tag per unit (a word, or a character for KLUE
NER), continued inside a token, characters past max_length predicted O; and with
``task.unit_probabilities=true`` each unit's tag probabilities (the softmax at the slot its tag is read
from; a character inside a token gets its token's, the B-X mass moved to I-X as the decode does), which
predictions.jsonl carries for ``action=label_issues``. Pure functions of arrays and lists."""
from __future__ import annotations

from typing import Any

import numpy as np

from kotune.core.log import log
from tasks.tagging import continuation, fill_uncovered, layout, unit_tags

PROBABILITY_DIGITS = 4  # as classification's probabilities in predictions.jsonl


class UnitTags(list):
    """A sentence's decoded tags (one per unit) that also carry each unit's tag probabilities
    (``task.unit_probabilities``): a plain list for scoring, the probabilities for predictions.jsonl."""

    def __init__(self, tags: list[str], probabilities: list[list[float] | None]):
        super().__init__(tags)
        self.probabilities = probabilities


def softmax(logits: np.ndarray) -> np.ndarray:
    out = np.exp(logits - logits.max(-1, keepdims=True))
    return out / out.sum(-1, keepdims=True)


# ---- the tasks -------------------------------------------------------------------------------


def continuation_index(labels: list[str]) -> np.ndarray:
    """Per label, the label a character inside its token carries (B-X → I-X where the model has I-X),
    so a token's probabilities sum onto its inner characters' tags."""
    index = {t: k for k, t in enumerate(labels)}
    return np.array([index.get(continuation(t), k) for k, t in enumerate(labels)])


def decode_tags(predictions, features, examples: list[dict], labels: list[str], join: str, decode_mode: str,
                unit_probabilities: bool) -> list[list[str]]:
    """Per example, one tag per unit (characters for KLUE NER): the argmax at the slot each unit's tag is
    read from (its first subword, or its own slot per character), continued inside a token; with
    ``unit_probabilities`` a :class:`UnitTags` carrying each unit's tag probabilities."""
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    ids = np.asarray(logits).argmax(-1)  # rows are padded with -100 by Trainer: read only valid slots
    probs = softmax(np.asarray(logits, dtype=np.float64)) if unit_probabilities else None
    into = continuation_index(labels) if probs is not None else None
    n_cut = 0
    outputs = []
    columns = ("char_index",) if decode_mode == "char" else ("token_start", "token_end")
    meta = features.select_columns([*columns, "char_limit"]).to_dict()
    for i, ex in enumerate(examples):
        lay = layout(ex["units"], join)
        char_tags: list[str | None] = [None] * len(lay.text)
        char_probs: list[Any] = [None] * len(lay.text)  # with unit_probabilities: per character
        row = ids[i]
        if decode_mode == "char":
            for j, c in enumerate(meta["char_index"][i]):
                char_tags[c] = labels[row[j]]
                if probs is not None:
                    char_probs[c] = probs[i, j]
        else:
            for t, (s, e) in enumerate(zip(meta["token_start"][i], meta["token_end"][i])):
                if s < 0:
                    continue
                tag = labels[row[t]]
                char_tags[s] = tag
                inner = None
                if probs is not None:
                    char_probs[s] = probs[i, t]
                    inner = np.bincount(into, weights=probs[i, t], minlength=len(labels))
                for c in range(s + 1, e):
                    if not lay.text[c].isspace():
                        char_tags[c] = continuation(tag)
                        char_probs[c] = inner
        limit = meta["char_limit"][i]
        n_cut += sum(1 for ch in lay.text[limit:] if not ch.isspace())
        tags = unit_tags(fill_uncovered(char_tags, lay.text, limit), lay)
        if probs is not None:
            tags = UnitTags(tags, [None if c >= limit or char_probs[c] is None else
                                   [round(float(p), PROBABILITY_DIGITS) for p in char_probs[c]]
                                   for c in lay.unit_first])
        outputs.append(tags)
    if n_cut:
        log(f"decode: {n_cut} characters past max_length predicted O")
    return outputs

