"""KLUE RE: the relation (30 classes, ``no_relation`` first) between a subject and an object
entity of a sentence.

* reading: hub ``klue/klue`` ``re`` rows (label = class id, named by the hub) and KLUE's official
  JSON (the same fields, label = name). Spans are ``start_idx..end_idx`` inclusive; every span is
  checked (``sentence[start:end+1] == word``): mismatches are counted and reported, and the span
  is used as given, never shifted.
* encoding (``task.markers``):

  - ``typed_punct`` (default): typed punctuation markers around the two entities (Zhou & Chen
    2021, "An Improved Baseline for Sentence-level Relation Extraction"):
    ``@ * PER * 이순신 @ ... # ^ LOC ^ 한산도 #``. Plain punctuation needs no new vocabulary
    entries, so it works unchanged with pretrained embeddings (nothing untrained is added) and
    with any tokenizer, the locally trained one of ``model=tiny`` included.
  - ``klue``: KLUE-baseline's scheme (klue_baseline/data/klue_re.py, ``KlueREProcessor``):
    ``<subj>이순신</subj>은 <obj>한산도</obj>에서 ...``, the four markers added to the vocabulary
    as special tokens (the task declares them in ``special_tokens``; the loader adds them and
    resizes the embeddings, heads/model/encoder.py ``add_special_tokens``), and its tokenization fix
    (``fix_tokenization_error``): a Hangul token right after a closing marker, with no space
    before it, becomes a word continuation (``이`` → ``##이``), as it would be without the marker.
    KLUE-baseline classifies [CLS] (``task.pooling=cls``).

  The head reads [CLS] (``task.pooling=cls``, the sequence head) or the states of the two
  opening markers (``entity_start``, heads/relation.py). The text is tokenized once; a sentence
  longer than ``max_length`` tokens keeps a window of those tokens centred on the two entities
  (never re-tokenized, so no word is cut and re-read and no marker falls out); the few whose
  entities alone are longer than the window are counted. (KLUE-baseline truncates at the end.)
* decoding: softmax probabilities (AUPRC needs them: predictions.jsonl carries them, so
  ``action=score`` of a run's own predictions gives its metrics) and the most probable relation.
* scoring: KLUE's micro F1 without ``no_relation`` (main) and AUPRC over the classes that have
  gold examples (a class without any is left out of the mean, with a warning: its area is not
  defined; KLUE-baseline's scikit-learn 0.24.1 gives NaN for the whole AUPRC).
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks import metric_sets
from tasks.base import EncodeSettings, Task
from kotune.core.errors import ConfigError, DataError
from tasks.io import field, read_records
from kotune.core.log import log, warn
from tasks.tagging import Warnings

POOLINGS = ("cls", "entity_start")
MARKERS = ("typed_punct", "klue")
ROLES = ("subject", "object")
# KLUE-baseline's special-token markers (KlueREProcessor.__init__)
KLUE_MARKERS = {"subject": ("<subj>", "</subj>"), "object": ("<obj>", "</obj>")}
HANGUL = ("가", "힣")  # the syllables fix_tokenization_error joins to a preceding closing marker


def marker_pair(role: str, entity_type: str, markers: str = "typed_punct") -> tuple[str, str]:
    """The text inserted before and after an entity. ``typed_punct``: ``@ * TYPE * `` … `` @`` for
    the subject, ``# ^ TYPE ^ `` … `` #`` for the object; ``klue``: ``<subj>`` … ``</subj>``,
    ``<obj>`` … ``</obj>``, with no space (KLUE-baseline's ``_mark_entity_spans``)."""
    if markers == "klue":
        return KLUE_MARKERS[role]
    outer, inner = ("@", "*") if role == "subject" else ("#", "^")
    return f"{outer} {inner} {entity_type} {inner} ", f" {outer}"


def mark(sentence: str, subject: dict, obj: dict, markers: str = "typed_punct") -> tuple[str, dict[str, tuple[int, int]]]:
    """The sentence with both entities marked, and per role the characters its marked entity
    covers (opening marker to closing marker). At one position a closing marker goes before an
    opening one."""
    inserts = []  # (position in the sentence, order at that position, text, role, opening?)
    for role, ent in (("subject", subject), ("object", obj)):
        before, after = marker_pair(role, ent["type"], markers)
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


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after one sequence ([CLS] … [SEP])."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    at = next(i for i in range(len(full)) if full[i:i + len(plain)] == plain)
    return full[:at], full[at + len(plain):]


def join_after_closing_markers(tokens: list[str], offsets: list[tuple[int, int]], text: str,
                               closing_ends: list[int], prefix: str = "##") -> list[str]:
    """KLUE-baseline's tokenization fix (``fix_tokenization_error``, bert-wp branch) on WordPiece
    tokens: after each closing marker (its text ends at a position in ``closing_ends``) not
    followed by a space, the next token, if it starts with a Hangul syllable and is not already a
    continuation, becomes one (``이`` → ``##이``): the marker split a word, and the particle is
    read as the word's continuation it would otherwise be."""
    out = list(tokens)
    for end in closing_ends:
        if end >= len(text) or text[end] == " ":
            continue
        marker = next((t for t, (_, e) in enumerate(offsets) if e == end), None)
        nxt = None if marker is None else marker + 1
        if nxt is not None and nxt < len(out) and not out[nxt].startswith(prefix) \
                and HANGUL[0] <= out[nxt][:1] <= HANGUL[1]:
            out[nxt] = prefix + out[nxt]
    return out


@register_task("re")
class RelationTask(Task):
    """KLUE RE (``task=re``)."""

    head = "relation"
    # [CLS] (sequence head) or the entity starts (relation head); the marker scheme the model read
    saved_options = {"pooling": "error", "markers": "error"}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.pooling = str(cfg.get("pooling", "entity_start"))
        if self.pooling not in POOLINGS:
            raise ConfigError(f"task.pooling={self.pooling}: choose one of {', '.join(POOLINGS)}")
        self.markers = str(cfg.get("markers", "typed_punct"))
        if self.markers not in MARKERS:
            raise ConfigError(f"task.markers={self.markers}: choose one of {', '.join(MARKERS)}")
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
        return (mark(ex["sentence"], ex["subject"], ex["object"], self.markers)[0] for ex in examples)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """``klue`` markers are new vocabulary entries: the loader adds them and resizes the embeddings."""
        return tuple(t for pair in KLUE_MARKERS.values() for t in pair) if self.markers == "klue" else ()

    @classmethod
    def export_note(cls, options: dict) -> str | None:
        """A [CLS] model exports as a plain sequence classifier, but it only knows marked sentences."""
        markers = str(options.get("markers") or "typed_punct")
        example, _ = mark("이순신은 한산도에서 싸웠다.", {"start": 0, "end": 2, "type": "PER"},
                          {"start": 5, "end": 7, "type": "LOC"}, markers)
        note = (f"this RE model reads sentences with both entities marked (task.markers={markers}), never "
                f"plain text: feed the pipeline e.g. '{example}' (tasks.re.mark)")
        if markers == "klue":
            note += ("; KLUE-baseline's tokenization fix (a Hangul token right after a closing marker read as "
                     "a continuation, 이 → ##이) is not in the exported tokenizer: pass pre-fixed input_ids "
                     "to match training exactly")
        return note

    def encode_key(self) -> dict:
        return {**super().encode_key(), "windows": "token ids"}  # windows are no longer re-tokenized text

    # ---- encoding ------------------------------------------------------------------------
    def model_columns(self, features) -> list[str]:
        keep = super().model_columns(features)
        return keep + ["subject_start", "object_start"] if self.head == "relation" else keep

    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"task {self.name} finds the entity markers by character offsets: it "
                              f"needs a fast tokenizer, got {type(tokenizer).__name__}")
        missing = [t for t in self.special_tokens if t not in tokenizer.get_vocab()]
        if missing:
            raise ConfigError(f"task.markers={self.markers}: the tokenizer lacks {', '.join(missing)} "
                              "(the loader adds a task's special_tokens with heads.model.encoder.add_special_tokens)")
        marked = [mark(ex["sentence"], ex["subject"], ex["object"], self.markers) for ex in examples]
        before, after = special_frame(tokenizer)
        budget = settings.max_length - len(before) - len(after)
        plain = tokenizer([text for text, _ in marked], add_special_tokens=False, return_offsets_mapping=True)
        prefix = getattr(tokenizer.backend_tokenizer.model, "continuing_subword_prefix", None)
        columns: dict[str, list] = {k: [] for k in ("input_ids", "attention_mask", "subject_start", "object_start")}
        n_windowed = n_too_long = n_lost = 0
        for i, (text, spans) in enumerate(marked):
            ids, offsets = plain["input_ids"][i], plain["offset_mapping"][i]
            if self.markers == "klue" and prefix:
                tokens = join_after_closing_markers(tokenizer.convert_ids_to_tokens(ids), offsets, text,
                                                    [end for _, end in spans.values()], prefix)
                # a continuation the vocabulary lacks keeps its token (KLUE-baseline would read [UNK])
                ids = [j if j != tokenizer.unk_token_id else old
                       for j, old in zip(tokenizer.convert_tokens_to_ids(tokens), ids)]
            a, b, fits = entity_window(offsets, min(s for s, _ in spans.values()),
                                       max(e for _, e in spans.values()), budget)
            n_windowed += (a, b) != (0, len(ids))
            n_too_long += not fits
            columns["input_ids"].append(before + ids[a:b] + after)
            columns["attention_mask"].append([1] * len(columns["input_ids"][-1]))
            for role in ROLES:
                opening = spans[role][0]
                tok = next((t for t in range(a, b) if offsets[t][0] <= opening < offsets[t][1]), None)
                n_lost += tok is None
                columns[f"{role}_start"].append(0 if tok is None else len(before) + tok - a)  # lost: [CLS]
        if settings.token_type_ids:
            columns["token_type_ids"] = [[0] * len(ids) for ids in columns["input_ids"]]
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

    def abstention_refusal(self) -> str | None:
        return None

    def top_predictions(self, outputs: list[dict]) -> list[tuple[str, float]]:
        return [(out["label"], max(out["probs"])) for out in outputs]

    def outputs_from_predictions(self, values: list[Any], examples: list[dict], path: str) -> list[dict]:
        """The predicted relation, and every relation's probability where the file has them (AUPRC needs
        them all; a file without them scores micro F1 only, and says so)."""
        from tasks.outputs import PROBABILITIES, check_labels, probability_row

        labels = [str(x) for x in self.labels]
        check_labels([str(v) for v in values], labels, path)
        given = [getattr(v, "probabilities", None) for v in values]
        if any(p is None for p in given):
            warn(f"{path}: no class probabilities ('{PROBABILITIES}': {{relation: probability}} per row, as "
                 "kotune's predictions.jsonl has them): scoring micro F1 only, AUPRC needs probabilities")
            return [{"label": str(v), "probs": None} for v in values]
        return [{"label": str(v), "probs": probability_row(probs, labels, path, f"id {ex['id']!r}", "relations")}
                for v, probs, ex in zip(values, given, examples)]

    def score(self, outputs: list[dict], examples: list[dict]) -> dict[str, float]:
        """Micro F1 without ``no_relation``; AUPRC when every output has class probabilities
        (``action=score`` of a file without them scores micro F1 only)."""
        golds = [ex["label"] for ex in examples]
        with_probs = all(o.get("probs") is not None for o in outputs)
        if with_probs:
            absent = [name for name in self.labels if name not in set(golds)]
            if absent:
                warn(f"AUPRC: {len(absent)} of {len(self.labels)} relations have no gold example here "
                     f"({', '.join(absent[:3])}{', …' if len(absent) > 3 else ''}): left out of the mean "
                     "(their area is undefined; KLUE-baseline's scikit-learn 0.24.1 gives NaN)")
        return metric_sets.klue_re_scores([o["label"] for o in outputs], golds, self.labels,
                                          [o["probs"] for o in outputs] if with_probs else None, self.no_relation)

    def prediction_records(self, outputs: list[dict], examples: list[dict]) -> list[dict]:
        """The predicted relation and every relation's probability (full precision: scoring the
        file with ``action=score`` reproduces the run's AUPRC)."""
        return [{"id": ex["id"], "prediction": out["label"], "probability": round(max(out["probs"]), 6),
                 "probabilities": dict(zip(self.labels, out["probs"])),
                 **({"gold": ex["label"]} if "label" in ex else {})}
                for out, ex in zip(outputs, examples)]
