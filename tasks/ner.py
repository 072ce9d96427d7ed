"""Token tagging: KLUE NER (a BIO tag per *character*) and the generic ``token_cls`` task (CoNLL-style
files, a tag per word or per character).

An example is a list of *units* (KLUE: characters, spaces included; CoNLL: words) with one tag each.
The units are joined into the raw text (``task.join``: "" for characters, " " for words), and the
raw text is tokenized with ``return_offsets_mapping``, so every subword knows the characters it
covers — whatever the tokenizer did with [UNK], emoji, spaces or normalisation.

* training labels (``encode``): a token's label is the tag of its first non-space character when
  that character starts a unit; other subwords, specials and padding get -100
  (``task.label_subwords=all`` labels them too, B- turned into I-). With ``task.decode=char`` each
  covered character gets its own label slot instead (head ``token_char``).
* decoding (``decode``): token tags back to character tags (a token's tag goes to its first
  character, its other characters continue it as I-), or with ``decode=char`` each character's own
  tag; characters no token covers (spaces, characters the tokenizer dropped) continue an entity
  only when both neighbours are in it; characters past ``max_length`` are predicted O.
* probabilities (``task.unit_probabilities=true``, off by default): each unit's tag probabilities
  (the softmax of the logits at the slot its tag is decided from; a character inside a token gets
  its token's, the B-X mass moved to I-X as the decode does), written in predictions.jsonl for
  ``action=label_issues``; refused with ``task.crf`` (Viterbi decodes whole paths, not per unit).
* scoring (``score``): KLUE's two F1s on characters, whitespace left out as KLUE-baseline does.
* ``ceiling``: the gold labels through exactly that alignment and decoding.

The file layouts' readers are in tasks/ner_read.py; the alignment's pure pieces in tasks/tagging.py.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks.base import IGNORE, EncodeSettings, Task, TaskOption
from kotune.core.errors import ConfigError, DataError
from tasks import metric_sets
from kotune.core.log import log
from tasks.ner_decode import decode_tags
from tasks.ner_read import file_scheme, read_conll, read_klue_hub, read_klue_tsv, read_sentences
from tasks.tagging import (BIO, DECODES, LABEL_SUBWORDS, LAYOUTS, SCHEME_ALIASES, SCHEMES, align, char_label, char_slots,
                           continuation, detect_layout, from_iob2,
                           inexpressible_entities, is_label_slot, Layout, layout, location, orphan_and_space_checks,
                           predicted_entities, read_lines, to_iob2, units_of, Warnings)
from tasks.transitions import bio_constraints, repair_bio


@register_task("token_cls")
class TokenTask(Task):
    """Generic token classification (``token_cls``): CoNLL-style files, tag per word or character."""

    def abstention_refusal(self) -> str | None:  # predict.min_confidence (tasks/abstention.py)
        return "tags tokens: a prediction is a tag sequence, not one class with one probability"

    head = "token"
    # decode and crf pick the head; how units are joined and which subwords carry labels shape its
    # input and the tag scheme auto found in the training file writes the predictions of an untagged file
    saved_options = {"decode": "error", "crf": "error", "join": "saved", "label_subwords": "saved", "scheme": "auto"}
    own_options = {"crf": TaskOption((None, False), "a CRF decodes sequences of tags: it needs a tagging task"),
                   "unit_probabilities": TaskOption((None, False), "per-unit tag probabilities of a tagging task")}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.decode_mode = str(cfg.get("decode", "subword"))
        if self.decode_mode not in DECODES:
            raise ConfigError(f"task.decode must be one of {', '.join(DECODES)}, got '{self.decode_mode}'")
        self.label_subwords = str(cfg.get("label_subwords", "first"))
        if self.label_subwords not in LABEL_SUBWORDS:
            raise ConfigError(f"task.label_subwords must be one of {', '.join(LABEL_SUBWORDS)}, "
                              f"got '{self.label_subwords}'")
        self.crf = bool(cfg.get("crf", False))  # a CRF over the emissions (heads/crf.py)
        self.join = str(cfg.get("join") or "")  # "" joins characters, " " joins words
        # predictions.jsonl: each unit's tag probabilities (action=label_issues reads them)
        self.unit_probabilities = bool(cfg.get("unit_probabilities", False))
        if self.unit_probabilities and self.crf:
            raise ConfigError("task.unit_probabilities=true with task.crf=true: a CRF decodes whole tag paths "
                              "by Viterbi, with no per-unit probabilities: set task.crf=false")
        self.layout = str(cfg.get("layout", "auto"))
        if self.layout not in LAYOUTS:
            raise ConfigError(f"task.layout must be one of {', '.join(LAYOUTS)}, got '{self.layout}'")
        scheme = str(cfg.get("scheme", "auto"))
        scheme = SCHEME_ALIASES.get(scheme, scheme)
        if scheme not in SCHEMES:
            raise ConfigError(f"task.scheme must be one of {', '.join(SCHEMES)}, got '{scheme}'")
        # the files' tag scheme; auto: set by the first file read (the training file)
        self.scheme: str | None = None if scheme == "auto" else scheme
        self.scheme_from = "task.scheme"

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        """CoNLL columns or one sentence per line (``task.layout``), tags in any scheme
        (``task.scheme``) read into IOB2; ``-DOCSTART-`` and ``task.comment_prefix`` lines skipped.
        ``labelled=False`` (action=predict) also takes files without tags: CoNLL with the unit column
        only, or one sentence per line (words for ``task.join=" "``, characters for ``join=""``)."""
        lines = read_lines(path)
        untagged_join = None if labelled else self.join
        layout_name = self.layout if self.layout != "auto" else detect_layout(lines, self.is_comment, untagged_join)
        if self.layout == "auto":
            log(f"{path}: layout {layout_name} (detected; task.layout= overrides)")
        if layout_name == "sentence":
            sentences = read_sentences(path, lines, labelled, self.join, self.is_comment)
        else:
            sentences = read_conll(path, lines, labelled, self.cfg.get("columns") or {}, self.join, self.is_comment)
        return self._examples(path, sentences, layout_name)

    def is_comment(self, line: str) -> bool:
        comment = self.cfg.get("comment_prefix")
        return line.startswith("-DOCSTART-") or bool(comment and line.startswith(comment))

    def _examples(self, path: str, sentences: list, layout_name: str) -> list[dict]:
        """Examples of (first line, units, tags or None, line of each unit) tuples, tags in IOB2."""
        self._resolve_scheme(path, [s for s in sentences if s[2] is not None])
        warnings, examples = Warnings(), []
        for first, units, tags, unit_lines in sentences:
            ex = {"id": f"{os.path.basename(path)}:{first}", "source": path, "line": first, "units": units}
            if tags is not None:
                ex["tags"] = [self._iob2(path, n, tag) for tag, n in zip(tags, unit_lines)]
                orphan_and_space_checks(ex, warnings)
            if layout_name == "sentence":
                ex["layout"] = "sentence"
            examples.append(ex)
        warnings.summary(path)
        return examples

    def _iob2(self, path: str, n: int, tag: str) -> str:
        converted = to_iob2(tag, self.scheme)
        if converted is None:
            raise DataError(path, n, f"tag '{tag}' does not fit the tag scheme {self.scheme} "
                                     f"({self.scheme_from}): set task.scheme= one of {', '.join(SCHEMES[1:])}")
        self._check_tag(path, n, converted)
        return converted

    def _resolve_scheme(self, path: str, sentences: list) -> None:
        """task.scheme=auto: the first file read with tags (the training file) decides the scheme,
        and ``task.scheme`` records it (saved with the model for untagged files)."""
        if self.scheme is not None or not sentences:
            return
        scheme = file_scheme(path, sentences)
        self.scheme, self.scheme_from = scheme, f"detected in {path}"
        self.cfg.scheme = scheme
        if scheme == "none":
            log(f"{path}: no entity tags: tag scheme none (tag accuracy only; task.scheme= overrides)")
        else:
            log(f"{path}: tag scheme {scheme} (detected; read as IOB2, predictions written back in it; "
                "task.scheme= overrides)")

    def read_hub(self, rows, path: str) -> list[dict]:
        raise ConfigError(f"task {self.name} reads local files: set data.train_file=... data.validation_file=...")

    @property
    def request_fields(self) -> tuple[str, ...]:
        return ("text",)

    def request_examples(self, items: list[dict[str, str]], source: str = "request") -> list[dict]:
        """A sentence per item, cut into units as an untagged file's line is (``task.join``)."""
        examples = []
        for i, item in enumerate(items):
            text = item.get("text")
            if not isinstance(text, str) or not text.strip():
                raise DataError(source, f"item {i}", f"empty or non-text value {text!r}")
            examples.append({"id": f"item {i}", "source": source, "line": i, "units": units_of(text, self.join)})
        return examples

    def _check_tag(self, path: str, where: Any, tag: str) -> None:
        if self.labels is not None and tag not in self.labels:
            raise DataError(path, where, f"unknown tag '{tag}' (expected one of: {', '.join(self.labels)})")
        if self.labels is None and self.scheme != "none" and not BIO.match(tag):
            raise DataError(path, where, f"unknown tag '{tag}': task.scheme={self.scheme} expects O, B-X or I-X")

    def fit_labels(self, train: list[dict]) -> None:
        if self.labels is None:
            tags = {t for ex in train for t in ex["tags"]}
            if self.label_subwords == "all":  # a word's later subwords learn I-X even where only B-X occurs
                tags |= {continuation(t) for t in tags}
            if self.crf and self.scheme != "none":  # an I-X the CRF must open as B-X (transitions.repair_bio)
                tags |= {"B-" + t[2:] for t in tags if t.startswith("I-")}
            self.labels = sorted(tags)

    def check_labels(self, examples: list[dict], path: str) -> None:
        known = set(self.labels)
        for ex in examples:
            for k, t in enumerate(ex["tags"]):
                if t not in known:
                    raise DataError(location(ex, k), None, f"sentence {ex['id']}: unknown tag '{t}' "
                                                           f"(training tags: {', '.join(self.labels)})")

    def text(self, ex: dict) -> str:
        return self.join.join(ex["units"])

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        return (self.text(ex) for ex in examples)

    # ---- model side ----------------------------------------------------------------------
    def head_options(self) -> dict:
        """The token head per character with task.decode=char, with a CRF with task.crf."""
        return {**({"units": "char"} if self.decode_mode == "char" else {}), **({"crf": True} if self.crf else {})}

    def head_kwargs(self) -> dict:
        kwargs = {"num_labels": len(self.labels), **self.head_options()}
        if self.decode_mode == "char":
            kwargs["max_char_positions"] = int(self.cfg.get("max_char_positions", 16))
        if self.crf:
            kwargs["crf_constraints"] = bio_constraints(self.labels, self.scheme)
        return kwargs

    def outputs_from_predictions(self, values: list[Any], examples: list[dict], path: str) -> list[list[str]]:
        """A tag per unit (a JSON list or whitespace-separated tags), as many as the example's units."""
        from tasks.outputs import check_labels, parse_tags

        outputs = [parse_tags(v) for v in values]
        for out, ex in zip(outputs, examples):
            if len(out) != len(ex["units"]):
                raise DataError(path, None, f"id {ex['id']!r}: {len(out)} predicted tags for {len(ex['units'])} "
                                            "units (characters for KLUE NER)")
        allowed = list(self.labels or sorted({t for ex in examples for t in ex["tags"]}))
        check_labels([t for out in outputs for t in out], allowed, path, "tag")
        return outputs

    def model_columns(self, features) -> list[str]:
        keep = super().model_columns(features)
        if self.decode_mode == "char":
            keep += ["char_token_index", "char_pos_start", "char_pos_end"]
        if self.crf:
            keep.append("label_slots")
        return keep

    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"task {self.name} aligns tags by character offsets: it needs a fast "
                              f"tokenizer, got {type(tokenizer).__name__}")
        label_id = {t: i for i, t in enumerate(self.labels)}
        label_all = self.label_subwords == "all"
        texts = [self.text(ex) for ex in examples]
        enc = tokenizer(texts, truncation=True, max_length=settings.max_length, return_offsets_mapping=True,
                        return_token_type_ids=settings.token_type_ids)
        unk = tokenizer.unk_token_id
        cols: dict[str, list] = {k: [] for k in enc.keys() if k != "offset_mapping"}
        meta: dict[str, list] = {k: [] for k in ("labels", "token_start", "token_end", "char_limit",
                                                 "unk_spans", "char_index", "char_token_index",
                                                 "char_pos_start", "char_pos_end", "label_slots")}
        warnings, n_cut, cut_chars, n_repaired = Warnings(), 0, 0, 0
        for i, ex in enumerate(examples):
            ids = enc["input_ids"][i]
            special = [s is None for s in enc.sequence_ids(i)]
            lay = layout(ex["units"], self.join)
            al = align(lay.text, enc["offset_mapping"][i], special, len(ids) >= settings.max_length)
            lost = sum(1 for ch in lay.text[al.char_limit:] if not ch.isspace())
            if lost:
                n_cut += 1
                cut_chars += lost
                warnings.warn("sentence longer than max_length", location(ex),
                              f"sentence {ex['id']} is longer than max_length={settings.max_length} "
                              f"tokens: its last {lost} characters are scored as predicted O")

            def label(c: int, lay: Layout = lay, tags: list[str] | None = ex.get("tags")) -> int:
                tag = char_label(c, lay, tags, label_all) if tags is not None else None
                return IGNORE if tag is None else label_id[tag]

            if self.decode_mode == "char":
                slots = char_slots(lay.text, al)
                starts = [c for c, _, _, _ in slots]
                meta["char_index"].append(starts)
                meta["char_token_index"].append([t for _, t, _, _ in slots])
                meta["char_pos_start"].append([p for _, _, p, _ in slots])
                meta["char_pos_end"].append([p for _, _, _, p in slots])
            else:
                starts = al.token_start
            meta["labels"].append([IGNORE if c < 0 else label(c) for c in starts])
            if self.crf:  # the CRF's chain: the slots a tag is read from, known with tags or without
                meta["label_slots"].append([int(c >= 0 and is_label_slot(c, lay, label_all)) for c in starts])
                n_repaired += self._repair(meta["labels"][-1]) if "tags" in ex else 0
            meta["token_start"].append(al.token_start)
            meta["token_end"].append(al.token_end)
            meta["char_limit"].append(al.char_limit)
            meta["unk_spans"].append([x for t, tid in enumerate(ids) if tid == unk and al.token_start[t] >= 0
                                      for x in (al.token_start[t], al.token_end[t])])
            for k in cols:
                cols[k].append(enc[k][i])
        if n_cut:
            log(f"{n_cut} of {len(examples)} sentences exceed max_length={settings.max_length}: "
                f"{cut_chars} characters past it are scored as predicted O")
        if n_repaired:
            log(f"task.crf: {n_repaired} training tag(s) I-X with no B-X/I-X slot before them (an entity starting "
                "inside a token) open their entity as B-X, the only way the CRF's transitions allow")
        meta = {k: v for k, v in meta.items() if len(v) == len(examples)}  # char_* only with decode=char
        if not all("tags" in ex for ex in examples):
            meta.pop("labels")
        return datasets.Dataset.from_dict({**cols, **meta})

    def _repair(self, row: list[int]) -> int:
        """The labelled slots of ``row`` (label ids, -100 elsewhere) made valid IOB2 in place; returns
        how many changed."""
        if self.scheme == "none":
            return 0
        where = [k for k, v in enumerate(row) if v != IGNORE]
        fixed, changed = repair_bio([self.labels[row[k]] for k in where])
        for k, tag in zip(where, fixed):
            row[k] = self.labels.index(tag)
        return changed

    # ---- decoding ------------------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[list[str]]:
        """Per example, one tag per unit (characters for KLUE NER); each unit's tag probabilities too
        with ``task.unit_probabilities`` (tasks/ner_decode.py)."""
        return decode_tags(predictions, features, examples, self.labels, self.join, self.decode_mode,
                           self.unit_probabilities)

    # ---- scoring -------------------------------------------------------------------------
    @staticmethod
    def scored_units(ex: dict) -> list[int]:
        """Units that count: whitespace is left out (KLUE-baseline drops the space rows)."""
        return [k for k, u in enumerate(ex["units"]) if not u.isspace()]

    def score(self, outputs: list[list[str]], examples: list[dict]) -> dict[str, float]:
        kept = [self.scored_units(ex) for ex in examples]
        return metric_sets.tagging_scores([[out[k] for k in keep] for out, keep in zip(outputs, kept)],
                                          [[ex["tags"][k] for k in keep] for ex, keep in zip(examples, kept)],
                                          self.labels, entities=self.scheme != "none")

    def prediction_records(self, outputs: list[list[str]], examples: list[dict]) -> list[dict]:
        """The text, its units (the words or characters each tag belongs to), the tags in the
        files' own scheme (IOBES, PER-B, ...: as they were read), the entities they make (type,
        text, character offsets in ``text``), each unit's tag probabilities with
        ``task.unit_probabilities=true`` and the gold tags where the file has them."""
        scheme = self.scheme or "iob2"
        records = []
        for out, ex in zip(outputs, examples):
            record = {"id": ex["id"], "text": self.text(ex), "units": list(ex["units"]),
                      "prediction": from_iob2(out, scheme)}
            if scheme != "none":
                record["entities"] = predicted_entities(ex["units"], self.join, out)
            if getattr(out, "probabilities", None) is not None:
                # per unit: its tag probabilities in the order of ``tags`` (the model's tags, IOB2),
                # null where the model saw nothing (spaces, characters past max_length)
                record["unit_probabilities"] = {"tags": list(self.labels), "units": out.probabilities}
            records.append(dict(record, **({"gold": from_iob2(ex["tags"], scheme)} if "tags" in ex else {})))
        return records

    # ---- pipeline ceiling ----------------------------------------------------------------
    def ceiling(self, features, examples: list[dict]) -> tuple[dict[str, float], dict]:
        """Gold labels, as encoded for training, through the evaluation decode: the best score any
        model can reach with this tokenizer and these settings; plus why entities are lost."""
        labels = features["labels"]
        width = max((len(r) for r in labels), default=0)
        onehot = np.zeros((len(labels), max(width, 1), len(self.labels)), dtype=np.float32)
        o_id = self.labels.index("O") if "O" in self.labels else 0
        for i, row in enumerate(labels):
            for t, lab in enumerate(row):
                onehot[i, t, o_id if lab == IGNORE else lab] = 1.0  # -100 slots are never read
        outputs = self.decode(onehot, features, examples)
        scores = self.score(outputs, examples)
        meta = features.select_columns(["token_start", "token_end", "char_limit", "unk_spans"]).to_dict()
        report = inexpressible_entities(outputs, meta, examples, [self.scored_units(ex) for ex in examples],
                                        self.join, self.decode_mode)
        return scores, report

@register_task("ner")
class NerTask(TokenTask):
    """KLUE NER: a BIO tag per character (spaces included); KLUE's official TSV or the hub rows."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.scheme = "iob2"  # KLUE's files and hub rows

    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        """KLUE's TSV: ``##`` comment lines, the last ``## guid<TAB>tagged sentence`` line before a
        sentence's rows names it, ``CHAR<TAB>TAG`` rows (the character may be a space), a blank line
        between sentences. ``labelled=False`` (action=predict) also takes the TSV without its tag
        column and plain text, one sentence per line (its characters, spaces included, are the units)."""
        lines = read_lines(path)
        if not labelled and detect_layout(lines, self.is_comment, self.join) == "sentence":
            log(f"{path}: plain text, one sentence per line (no tabs)")
            return self._examples(path, read_sentences(path, lines, labelled, self.join, self.is_comment), "sentence")
        return read_klue_tsv(path, lines, labelled, self.is_comment, self._check_tag)

    def is_comment(self, line: str) -> bool:
        return line.startswith("##")

    def read_hub(self, rows, path: str) -> list[dict]:
        """Hub rows (``klue/klue`` ``ner``): ``tokens`` are characters (spaces included), ``ner_tags``
        class ids translated by the hub's own label names (tasks/ner_read.py)."""
        return read_klue_hub(rows, path, self.cfg.hub.columns, self._check_tag)

    def score(self, outputs: list[list[str]], examples: list[dict]) -> dict[str, float]:
        """KLUE's NER metrics on characters, whitespace left out: seqeval strict IOB2 entity F1
        (macro, micro), character macro F1 over the 12 entity tags, and KLUE-baseline's variant
        that also counts O."""
        return metric_sets.klue_ner_scores(outputs, [ex["tags"] for ex in examples], chars=[ex["units"] for ex in examples])
