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
* scoring (``score``): KLUE's two F1s on characters, whitespace left out as KLUE-baseline does.
* ``ceiling``: the gold labels through exactly that alignment and decoding.
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks.base import IGNORE, EncodeSettings, Task, TaskOption
from kotune.core.errors import ConfigError, DataError
from tasks import metric_sets
from kotune.core.log import log
from tasks.tagging import (BIO, DECODES, LABEL_SUBWORDS, LAYOUTS, SCHEME_ALIASES, SCHEMES, align, char_label, char_slots,
                           continuation, detect_layout, detect_scheme, entity_spans, fill_uncovered, from_iob2,
                           inside_sentence, is_label_slot, Layout, layout, location, orphan_and_space_checks,
                           predicted_entities, read_lines, tag_parts, TagPresence, to_iob2, unit_tags, units_of,
                           Warnings)
from tasks.transitions import bio_constraints, repair_bio


# ---- the tasks -------------------------------------------------------------------------------
@register_task("token_cls")
class TokenTask(Task):
    """Generic token classification (``token_cls``): CoNLL-style files, tag per word or character."""

    head = "token"
    # decode and crf pick the head; how units are joined and which subwords carry labels shape its
    # input and the tag scheme auto found in the training file writes the predictions of an untagged file
    saved_options = {"decode": "error", "crf": "error", "join": "saved", "label_subwords": "saved", "scheme": "auto"}
    own_options = {"crf": TaskOption((None, False), "a CRF decodes sequences of tags: it needs a tagging task")}

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
        read = self._read_sentences if layout_name == "sentence" else self._read_conll
        return self._examples(path, read(path, lines, labelled), layout_name)

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
        tags = [t for _, _, tags, _ in sentences for t in tags]
        scheme = detect_scheme(tags)
        if scheme is None:
            suffix = sum(1 for t in tags if tag_parts(t, True)) > sum(1 for t in tags if tag_parts(t, False))
            line, odd = next((n, t) for _, _, ts, ns in sentences for t, n in zip(ts, ns)
                             if t != "O" and not tag_parts(t, suffix))
            raise DataError(path, line, f"tag '{odd}' is not an entity tag like the others "
                                        f"({'X-B' if suffix else 'B-X'}): fix it, or set task.scheme=none "
                                        "to learn the tags as they are (no entity F1)")
        self.scheme, self.scheme_from = scheme, f"detected in {path}"
        self.cfg.scheme = scheme
        if scheme == "none":
            log(f"{path}: no entity tags: tag scheme none (tag accuracy only; task.scheme= overrides)")
        else:
            log(f"{path}: tag scheme {scheme} (detected; read as IOB2, predictions written back in it; "
                "task.scheme= overrides)")

    def _read_conll(self, path: str, lines: list[str], labelled: bool) -> list:
        """One unit per line, columns split by tab (or by whitespace when the line has no tab),
        blank line between sentences: (first line, units, tags, line of each unit) per sentence;
        unlabelled, the unit alone on its line (tags None)."""
        cols = self.cfg.get("columns") or {}
        token_col, tag_col = int(cols.get("token", 0)), int(cols.get("tag", -1))
        sentences: list = []
        units: list[str] = []
        tags: list[str] = []
        unit_lines: list[int] = []
        n_cols = None
        presence = TagPresence(path)

        def close():
            if units:
                sentences.append((unit_lines[0], list(units), list(tags) if tags else None, list(unit_lines)))
            units.clear()
            tags.clear()
            unit_lines.clear()

        for n, line in enumerate(lines, 1):
            if not line.strip() and "\t" not in line:
                if line and units and inside_sentence(lines, n, self.is_comment):
                    if labelled or self.join:
                        raise DataError(path, n, "no tag (a space character without its tag? a blank line "
                                                 "between sentences must be empty)")
                    presence.check(n, False)  # a space character of an untagged character file
                    units.append(line)
                    unit_lines.append(n)
                    continue
                close()
                continue
            if self.is_comment(line):
                continue
            row = line.split("\t") if "\t" in line else line.split()
            if len(row) < 2 and labelled:
                raise DataError(path, n, f"no tag (a unit{' or a space' if self.join == '' else ''} alone; "
                                         f"expected UNIT<TAB>TAG)")
            presence.check(n, len(row) >= 2)
            if len(row) < 2:
                units.append(row[0])
                unit_lines.append(n)
                continue
            n_cols = n_cols or len(row)
            try:
                if len(row) != n_cols:
                    raise IndexError
                unit, tag = row[token_col], row[tag_col].strip()
            except IndexError:
                raise DataError(path, n, f"{len(row)} columns, expected {n_cols} (unit column "
                                         f"{token_col}, tag column {tag_col})") from None
            if not tag:
                raise DataError(path, n, f"no tag (tag column {tag_col} is empty)")
            if " " in tag:
                raise DataError(path, n, f"tag {tag!r} holds spaces: one sentence per line? set task.layout=sentence")
            if not unit or (self.join and unit.isspace()):
                raise DataError(path, n, f"empty unit {unit!r}")
            units.append(unit)
            tags.append(tag)
            unit_lines.append(n)
        close()
        return sentences

    def _read_sentences(self, path: str, lines: list[str], labelled: bool) -> list:
        """One sentence per line: space-separated words, a tab, as many space-separated tags;
        unlabelled, the sentence alone (words for ``task.join=" "``, else characters; tags None)."""
        sentences = []
        presence = TagPresence(path)
        for n, line in enumerate(lines, 1):
            if not line.strip() or self.is_comment(line):
                continue
            if "\t" not in line and not labelled:
                presence.check(n, False)
                if sentences == []:  # the first plain sentence: say what a tag will belong to
                    log(f"{path}: plain sentences: a tag per {'word, split on spaces' if self.join else 'character'} "
                        f"(task.join={self.join!r}); if the training file's units were segmented otherwise (e.g. "
                        "morphemes), give the same units here, one per line")
                units = units_of(line, self.join)
                sentences.append((n, units, None, [n] * len(units)))
                continue
            presence.check(n, True)
            if line.count("\t") != 1:
                raise DataError(path, n, f"{line.count(chr(9))} tabs, expected 1 (task.layout=sentence: "
                                         "WORDS<TAB>TAGS)")
            words, tags = (part.split() for part in line.split("\t"))
            if not words:
                raise DataError(path, n, "no words before the tab")
            if not tags:
                raise DataError(path, n, "no tag")
            if len(words) != len(tags):
                raise DataError(path, n, f"{len(words)} words but {len(tags)} tags")
            sentences.append((n, words, tags, [n] * len(words)))
        return sentences

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
        """Per example, one tag per unit (characters for KLUE NER)."""
        logits = predictions[0] if isinstance(predictions, tuple) else predictions
        ids = np.asarray(logits).argmax(-1)  # rows are padded with -100 by Trainer: read only valid slots
        n_cut = 0
        outputs = []
        columns = ("char_index",) if self.decode_mode == "char" else ("token_start", "token_end")
        meta = features.select_columns([*columns, "char_limit"]).to_dict()
        for i, ex in enumerate(examples):
            lay = layout(ex["units"], self.join)
            char_tags: list[str | None] = [None] * len(lay.text)
            row = ids[i]
            if self.decode_mode == "char":
                for j, c in enumerate(meta["char_index"][i]):
                    char_tags[c] = self.labels[row[j]]
            else:
                for t, (s, e) in enumerate(zip(meta["token_start"][i], meta["token_end"][i])):
                    if s < 0:
                        continue
                    tag = self.labels[row[t]]
                    char_tags[s] = tag
                    for c in range(s + 1, e):
                        if not lay.text[c].isspace():
                            char_tags[c] = continuation(tag)
            limit = meta["char_limit"][i]
            n_cut += sum(1 for ch in lay.text[limit:] if not ch.isspace())
            outputs.append(unit_tags(fill_uncovered(char_tags, lay.text, limit), lay))
        if n_cut:
            log(f"decode: {n_cut} characters past max_length predicted O")
        return outputs

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
        text, character offsets in ``text``) and the gold tags where the file has them."""
        scheme = self.scheme or "iob2"
        records = []
        for out, ex in zip(outputs, examples):
            record = {"id": ex["id"], "text": self.text(ex), "units": list(ex["units"]),
                      "prediction": from_iob2(out, scheme)}
            if scheme != "none":
                record["entities"] = predicted_entities(ex["units"], self.join, out)
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
        report = self._inexpressible(outputs, features, examples)
        return scores, report

    def _inexpressible(self, outputs: list[list[str]], features, examples: list[dict]) -> dict:
        meta = features.select_columns(["token_start", "token_end", "char_limit", "unk_spans"]).to_dict()
        reasons: Counter = Counter()
        shown: list[str] = []
        n_gold = n_spurious = 0
        for i, (out, ex) in enumerate(zip(outputs, examples)):
            keep = self.scored_units(ex)
            gold = entity_spans(ex["tags"], keep)
            pred = entity_spans(out, keep)
            n_gold += len(gold)
            n_spurious += len(pred - gold)
            lay = layout(ex["units"], self.join)
            tokens = [(s, e) for s, e in zip(meta["token_start"][i], meta["token_end"][i]) if s >= 0]
            unks = meta["unk_spans"][i]
            unk_set = {(unks[k], unks[k + 1]) for k in range(0, len(unks), 2)}
            covered = {c for s, e in tokens for c in range(s, e)}
            for typ, u0, u1 in sorted(gold - pred, key=lambda x: x[1]):
                c0 = lay.unit_first[u0]
                c1 = lay.unit_first[u1 - 1] + len(ex["units"][u1 - 1].strip())
                crossing = [(s, e) for s, e in tokens if s < c0 < e or s < c1 < e]
                if c1 > meta["char_limit"][i]:
                    why = "truncation (past max_length)"
                elif any(tok in unk_set for tok in crossing):
                    why = "boundary inside an [UNK] token"
                elif crossing:
                    why = "boundary inside a token"
                elif any(c not in covered and not lay.text[c].isspace() for c in range(c0, c1)):
                    why = "character dropped by the tokenizer"
                else:
                    why = "other (inconsistent gold tags)"
                reasons[why] += 1
                if len(shown) < 5:
                    tok = ", ".join(repr(lay.text[s:e]) for s, e in crossing)
                    shown.append(f"{ex['id']}: {lay.text[c0:c1]!r} ({typ}): {why}" + (f" {tok}" if tok else ""))
        lost = sum(reasons.values())
        lines = [f"ceiling ({self.decode_mode} decode): {lost} of {n_gold} gold entities inexpressible, "
                 f"{n_spurious} spurious"]
        lines += [f"  {n:6d}  {why}" for why, n in reasons.most_common()]
        lines += [f"  e.g. {s}" for s in shown]
        return {"decode": self.decode_mode, "gold_entities": n_gold, "inexpressible": lost,
                "spurious": n_spurious, "reasons": dict(reasons), "examples": shown, "lines": lines}


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
            return self._examples(path, self._read_sentences(path, lines, labelled), "sentence")
        warnings, examples, presence = Warnings(), [], TagPresence(path)
        cur: dict | None = None
        header: tuple[str, int] | None = None  # (guid, line) of the latest sentence header
        header_used = True

        def close():
            nonlocal cur
            if cur is not None:
                examples.append(cur)
            cur = None

        def add(n: int, char: str, tag: str | None) -> None:
            nonlocal cur, header_used
            presence.check(n, tag is not None)
            if cur is None:
                guid = header[0] if header and not header_used else f"{os.path.basename(path)}:{n}"
                header_used = True
                cur = {"id": guid, "source": path, "line": n, "units": [], **({"tags": []} if tag is not None else {})}
            cur["units"].append(char)
            if tag is not None:
                cur["tags"].append(tag)

        for n, line in enumerate(lines, 1):
            if self.is_comment(line):
                close()
                if "\t" in line:
                    header, header_used = (line[2:].split("\t", 1)[0].strip(), n), False
                continue
            if "\t" not in line and not line.strip():
                if line and cur is not None and inside_sentence(lines, n, self.is_comment):
                    if labelled:
                        raise DataError(path, n, "no tag (a space character without its tag? a blank "
                                                 "line between sentences must be empty)")
                    add(n, line, None)  # a space character of an untagged file
                    continue
                if cur is None and not header_used:
                    warnings.warn("empty sentence", f"{path}:{header[1]}",
                                  f"sentence {header[0]} has no characters (skipped)")
                    header_used = True
                close()
                continue
            row = line.split("\t")
            if len(row) == 1 and not labelled:
                add(n, line, None)
                continue
            if len(row) == 1 or not row[1].strip():
                raise DataError(path, n, "no tag (expected CHAR<TAB>TAG)")
            if len(row) != 2:
                raise DataError(path, n, f"{len(row)} tab-separated columns, expected 2 (CHAR<TAB>TAG)")
            char, tag = row[0], row[1].strip()
            if not char:
                raise DataError(path, n, "empty character column")
            self._check_tag(path, n, tag)
            add(n, char, tag)
        close()
        if cur is None and not header_used and header is not None:
            warnings.warn("empty sentence", f"{path}:{header[1]}", f"sentence {header[0]} has no characters (skipped)")
        for ex in examples:
            if "tags" in ex:
                orphan_and_space_checks(ex, warnings)
        warnings.summary(path)
        return examples

    def is_comment(self, line: str) -> bool:
        return line.startswith("##")

    def read_hub(self, rows, path: str) -> list[dict]:
        """Hub rows (``klue/klue`` ``ner``): ``tokens`` are characters (spaces included), ``ner_tags``
        class ids translated by the hub's own label names."""
        cols = self.cfg.hub.columns
        names = rows.features[cols.tags].feature.names
        warnings, examples = Warnings(), []
        for i, row in enumerate(rows):
            units, ids = row[cols.tokens], row[cols.tags]
            if len(units) != len(ids):
                raise DataError(path, f"row {i}", f"{len(units)} characters but {len(ids)} tags")
            if not units:
                warnings.warn("empty sentence", f"{path} row {i}", "no characters (skipped)")
                continue
            tags = [names[t] for t in ids]
            for t in tags:
                self._check_tag(path, f"row {i}", t)
            ex = {"id": str(row.get("guid", i)), "source": path, "row": i, "units": list(units), "tags": tags}
            orphan_and_space_checks(ex, warnings)
            examples.append(ex)
        warnings.summary(path)
        return examples

    def score(self, outputs: list[list[str]], examples: list[dict]) -> dict[str, float]:
        """KLUE's NER metrics on characters, whitespace left out: seqeval strict IOB2 entity F1
        (macro, micro), character macro F1 over the 12 entity tags, and KLUE-baseline's variant
        that also counts O."""
        return metric_sets.klue_ner_scores(outputs, [ex["tags"] for ex in examples], chars=[ex["units"] for ex in examples])
