"""KLUE RE: the relation (30 classes, ``no_relation`` first) between a subject and an object
entity of a sentence.

* reading: hub ``klue/klue`` ``re`` rows (label = class id, named by the hub) and KLUE's official
  JSON (the same fields, label = name). Spans are ``start_idx..end_idx`` inclusive; every span is
  checked (``sentence[start:end+1] == word``): mismatches are counted and reported, and the span
  is used as given, never shifted.
* encoding: typed punctuation markers around the two entities (Zhou & Chen 2021,
  "An Improved Baseline for Sentence-level Relation Extraction"):
  ``@ * PER * 이순신 @ ... # ^ LOC ^ 한산도 #``. Plain punctuation needs no new vocabulary entries,
  so it works unchanged with pretrained embeddings (nothing untrained is added) and with any
  tokenizer, the locally trained one of ``model=tiny`` included. The head reads [CLS]
  (``task.pooling=cls``, the sequence head) or the states of the two opening markers
  (``entity_start``, heads/relation.py). A sentence longer than ``max_length`` tokens is cut to a
  window of tokens centred on the two entities, so they are never cut out; the few whose entities
  alone are longer than the window are counted.
* decoding: softmax probabilities (AUPRC needs them) and the most probable relation.
* scoring: KLUE's micro F1 without ``no_relation`` (main) and AUPRC over all 30 classes.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tasks import metric_sets
from tasks.base import EncodeSettings, Task
from tasks.errors import ConfigError, DataError
from tasks.io import field, read_records
from tasks.log import log
from tasks.ner import Warnings

POOLINGS = ("cls", "entity_start")
ROLES = ("subject", "object")


def marker_pair(role: str, entity_type: str) -> tuple[str, str]:
    """The text inserted before and after an entity: ``@ * TYPE * `` … `` @`` for the subject,
    ``# ^ TYPE ^ `` … `` #`` for the object."""
    outer, inner = ("@", "*") if role == "subject" else ("#", "^")
    return f"{outer} {inner} {entity_type} {inner} ", f" {outer}"


def mark(sentence: str, subject: dict, obj: dict) -> tuple[str, dict[str, tuple[int, int]]]:
    """The sentence with both entities marked, and per role the characters its marked entity
    covers (opening marker to closing marker). At one position a closing marker goes before an
    opening one."""
    inserts = []  # (position in the sentence, order at that position, text, role, opening?)
    for role, ent in (("subject", subject), ("object", obj)):
        before, after = marker_pair(role, ent["type"])
        inserts.append((ent["start"], 1, before, role, True))
        inserts.append((ent["end"] + 1, 0, after, role, False))
    parts, spans, done, shift = [], {}, 0, 0
    for pos, _, piece, role, opening in sorted(inserts, key=lambda x: (x[0], x[1])):
        parts += [sentence[done:pos], piece]
        done = pos
        if opening:
            spans[role] = (pos + shift, -1)
        else:
            spans[role] = (spans[role][0], pos + shift + len(piece))
        shift += len(piece)
    parts.append(sentence[done:])
    return "".join(parts), spans


def entity_window(offsets: list[tuple[int, int]], lo: int, hi: int, budget: int) -> tuple[int, int, bool]:
    """Token range [a, b) of at most ``budget`` tokens keeping characters ``lo..hi`` (both
    entities with their markers), centred on them; ``False`` when they alone do not fit."""
    n = len(offsets)
    if n <= budget:
        return 0, n, True
    first = next((t for t, (s, e) in enumerate(offsets) if e > lo), 0)
    last = max((t for t, (s, e) in enumerate(offsets) if s < hi), default=first)
    need = last - first + 1
    if need > budget:
        return first, first + budget, False
    start = max(0, first - (budget - need) // 2)
    start = min(start, n - budget)
    return start, start + budget, True


class RelationTask(Task):
    """KLUE RE (``task=re``)."""

    head = "relation"
    saved_options = {"pooling": "error"}  # [CLS] (sequence head) or the entity starts (relation head)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.pooling = str(cfg.get("pooling", "entity_start"))
        if self.pooling not in POOLINGS:
            raise ConfigError(f"task.pooling={self.pooling}: choose one of {', '.join(POOLINGS)}")
        # [CLS] is what the sequence head reads; the entity-start states need the relation head
        self.head = "sequence" if self.pooling == "cls" else "relation"
        self.no_relation = str(cfg.get("no_relation", "no_relation"))
        if self.labels and self.no_relation not in self.labels:
            raise ConfigError(f"task.no_relation={self.no_relation} is not among task.labels")

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        """KLUE's official RE JSON: a list of objects with ``guid``, ``sentence``,
        ``subject_entity``/``object_entity`` {word, start_idx, end_idx, type} and ``label`` (name)."""
        warnings = Warnings()
        examples = [self._example(path, where, row, field(path, where, row, "label", required=False), warnings)
                    for where, row in read_records(path, self.cfg.get("format"))]
        self._report(path, examples, warnings)
        return examples

    def read_hub(self, rows, path: str) -> list[dict]:
        """Hub rows (``klue/klue`` ``re``): the label is a class id, named by the hub's features."""
        names = rows.features["label"].names
        warnings, examples = Warnings(), []
        for i, row in enumerate(rows):
            raw = row.get("label")
            examples.append(self._example(path, f"row {i}", row, None if raw is None else names[raw], warnings))
        self._report(path, examples, warnings)
        return examples

    def _example(self, path: str, where: str, row: dict, label: Any, warnings: Warnings) -> dict:
        sentence = field(path, where, row, "sentence")
        if not isinstance(sentence, str) or not sentence.strip():
            raise DataError(path, where, f"empty or non-text sentence {sentence!r}")
        ex = {"id": str(row.get("guid", where)), "sentence": sentence, "span_mismatch": False}
        for role in ROLES:
            ent = field(path, where, row, f"{role}_entity")
            try:
                start, end = int(ent["start_idx"]), int(ent["end_idx"])
                word, typ = str(ent["word"]), str(ent["type"])
            except (KeyError, TypeError, ValueError):
                raise DataError(path, where, f"{role}_entity needs word, start_idx, end_idx and type; "
                                             f"got {ent!r}") from None
            if not 0 <= start <= end < len(sentence):
                raise DataError(path, where, f"{role}_entity span {start}..{end} lies outside the "
                                             f"sentence ({len(sentence)} characters)")
            if sentence[start:end + 1] != word:  # reported, never shifted: the span is the annotation
                ex["span_mismatch"] = True
                warnings.warn("entity span not matching its word", f"{path} {where}",
                              f"{role} '{word}' but sentence[{start}:{end + 1}] is "
                              f"'{sentence[start:end + 1]}' (span kept as given)")
            ex[role] = {"word": word, "start": start, "end": end, "type": typ}
        if label is not None and label != "":
            name = str(label)
            if self.labels is not None and name not in self.labels:
                raise DataError(path, where, f"unknown relation '{name}' (expected one of: "
                                             f"{', '.join(self.labels)})")
            ex["label"] = name
        return ex

    @staticmethod
    def _report(path: str, examples: list[dict], warnings: Warnings) -> None:
        warnings.summary(path)
        bad = sum(ex["span_mismatch"] for ex in examples)
        if bad:
            log(f"{path}: {bad} of {len(examples)} examples have an entity span that does not match "
                "its word (kept as given)")

    def holdout_group(self, example: dict) -> str | None:
        """Relations of the same sentence split together."""
        return example["sentence"]

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        return (mark(ex["sentence"], ex["subject"], ex["object"])[0] for ex in examples)

    # ---- encoding ------------------------------------------------------------------------
    def model_columns(self, features) -> list[str]:
        keep = super().model_columns(features)
        return keep + ["subject_start", "object_start"] if self.head == "relation" else keep

    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"task {self.name} finds the entity markers by character offsets: it "
                              f"needs a fast tokenizer, got {type(tokenizer).__name__}")
        marked = [mark(ex["sentence"], ex["subject"], ex["object"]) for ex in examples]
        budget = settings.max_length - tokenizer.num_special_tokens_to_add(pair=False)
        plain = tokenizer([text for text, _ in marked], add_special_tokens=False, return_offsets_mapping=True)
        texts, windows, n_windowed, n_too_long = [], [], 0, 0
        for i, (text, spans) in enumerate(marked):
            offsets = plain["offset_mapping"][i]
            a, b, fits = entity_window(offsets, min(s for s, _ in spans.values()),
                                       max(e for _, e in spans.values()), budget)
            if (a, b) != (0, len(offsets)):
                n_windowed += 1
                n_too_long += not fits
                c0, c1 = offsets[a][0], offsets[b - 1][1]
            else:
                c0, c1 = 0, len(text)
            texts.append(text[c0:c1])
            windows.append(c0)
        enc = tokenizer(texts, truncation=True, max_length=settings.max_length, return_offsets_mapping=True,
                        return_token_type_ids=settings.token_type_ids)
        columns: dict[str, list] = {k: list(v) for k, v in enc.items() if k != "offset_mapping"}
        columns["subject_start"], columns["object_start"] = [], []
        n_lost = 0
        for i, ((_, spans), c0) in enumerate(zip(marked, windows)):
            special = [s is None for s in enc.sequence_ids(i)]
            for role in ROLES:
                pos = spans[role][0] - c0
                tok = next((t for t, ((s, e), sp) in enumerate(zip(enc["offset_mapping"][i], special))
                            if not sp and s <= pos < e), None)
                n_lost += tok is None
                columns[f"{role}_start"].append(0 if tok is None else tok)  # lost: read [CLS] instead
        if n_windowed:
            log(f"{n_windowed} of {len(examples)} examples exceed max_length={settings.max_length}: cut to "
                f"a window around their entities" + (f"; in {n_too_long} the entities alone exceed it"
                                                      if n_too_long else ""))
        if n_lost:
            log(f"warning: {n_lost} entity markers fell outside max_length={settings.max_length} (read [CLS])")
        if all("label" in ex for ex in examples):
            label_id = {name: k for k, name in enumerate(self.labels)}
            columns["labels"] = [label_id[ex["label"]] for ex in examples]
        return datasets.Dataset.from_dict(columns)

    # ---- decoding and scoring ------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[dict]:
        """Per example the predicted relation and the probability of every relation."""
        logits = np.asarray(predictions[0] if isinstance(predictions, tuple) else predictions, dtype=np.float64)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return [{"label": self.labels[int(row.argmax())], "probs": row.tolist()} for row in probs]

    def score(self, outputs: list[dict], examples: list[dict]) -> dict[str, float]:
        return metric_sets.klue_re_scores([o["label"] for o in outputs], [ex["label"] for ex in examples],
                                          self.labels, [o["probs"] for o in outputs], self.no_relation)

    def prediction_records(self, outputs: list[dict], examples: list[dict]) -> list[dict]:
        return [{"id": ex["id"], "prediction": out["label"],
                 "probability": round(max(out["probs"]), 6), **({"gold": ex["label"]} if "label" in ex else {})}
                for out, ex in zip(outputs, examples)]
