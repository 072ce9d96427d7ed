"""Token tagging's pure pieces, shared by tasks/ner.py (NER, token_cls), tasks/dp.py and tasks/re.py:
tag schemes (IOB2, IOBES, suffix forms) read into IOB2 and written back, tagging-file layouts
(CoNLL columns or a sentence per line), per-file warning counts, and the alignment of units
(characters or words) with a tokenizer's offsets. Functions of plain lists and strings: no model,
no tokenizer object."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from tasks import metrics_spans
from kotune.core.errors import DataError
from tasks.io import open_text, text_lines
from kotune.core.log import log

DECODES = ("subword", "char")
LABEL_SUBWORDS = ("first", "all")
LAYOUTS = ("auto", "conll", "sentence")
# tag schemes of the files (read into IOB2, written back as they came); none: tags as they are
SCHEMES = ("auto", "iob2", "iobes", "iob2_suffix", "iobes_suffix", "none")
SCHEME_ALIASES = {"bioes": "iobes", "bioes_suffix": "iobes_suffix"}
MAX_WARNINGS = 5  # per kind and file; the rest are counted in one summary line
BIO = re.compile(r"^(O|[BI]-\S+)$")
PREFIX_TAG = re.compile(r"^([BIES])-(\S+)$")  # B-PER
SUFFIX_TAG = re.compile(r"^(\S+)-([BIES])$")  # PER-B


def continuation(tag: str) -> str:
    """The tag a character inside the same entity carries: ``B-X``/``I-X`` → ``I-X``; others stay."""
    return "I-" + tag[2:] if tag[:2] in ("B-", "I-") else tag


# ---- tag schemes (pure functions of plain lists) ----------------------------------------------
def tag_parts(tag: str, suffix: bool) -> tuple[str, str] | None:
    """(letter, type) of an entity tag written ``B-PER`` (or ``PER-B`` with ``suffix``); None if
    the tag is not written that way."""
    m = (SUFFIX_TAG if suffix else PREFIX_TAG).match(tag)
    if not m:
        return None
    return (m.group(2), m.group(1)) if suffix else (m.group(1), m.group(2))


def looks_like_tag(field: str) -> bool:
    """``O`` or an entity tag in any scheme (``B-PER``, ``PER-B``)."""
    return field == "O" or bool(tag_parts(field, False) or tag_parts(field, True))


def detect_scheme(tags: Iterable[str]) -> str | None:
    """The scheme every tag fits: prefix (``B-X``) before suffix (``X-B``), ``iobes`` when any
    ``S``/``E`` occurs; ``none`` when no tag is an entity tag (e.g. POS tags); None when some
    are and some are not."""
    entity_tags = set(tags) - {"O"}
    if not entity_tags:
        return "iob2"
    for suffix in (False, True):
        parts = [tag_parts(t, suffix) for t in entity_tags]
        if all(parts):
            ends = any(letter in "ES" for letter, _ in parts)
            return ("iobes" if ends else "iob2") + ("_suffix" if suffix else "")
    if not any(tag_parts(t, False) or tag_parts(t, True) for t in entity_tags):
        return "none"
    return None


def to_iob2(tag: str, scheme: str) -> str | None:
    """A file's tag in IOB2 (``S-X`` → ``B-X``, ``E-X`` → ``I-X``, ``X-B`` → ``B-X``); None when
    it does not fit ``scheme``."""
    if scheme == "none" or tag == "O":
        return tag
    parts = tag_parts(tag, scheme.endswith("_suffix"))
    if parts is None or parts[0] not in ("BIES" if scheme.startswith("iobes") else "BI"):
        return None
    letter, typ = parts
    return ("B-" if letter in "BS" else "I-") + typ


def from_iob2(tags: list[str], scheme: str) -> list[str]:
    """IOB2 tags written in ``scheme``: the inverse of :func:`to_iob2` on a sentence (an entity's
    last tag becomes ``E-X``, a one-unit entity ``S-X`` in IOBES)."""
    if scheme in ("none", "iob2"):
        return list(tags)
    out = []
    for k, tag in enumerate(tags):
        if tag[:2] not in ("B-", "I-"):
            out.append(tag)
            continue
        letter, typ = tag[0], tag[2:]
        if scheme.startswith("iobes"):
            last = (tags[k + 1] if k + 1 < len(tags) else "O") != "I-" + typ
            letter = {"B": "S", "I": "E"}[letter] if last else letter
        out.append(f"{typ}-{letter}" if scheme.endswith("_suffix") else f"{letter}-{typ}")
    return out


def inside_sentence(lines: list[str], n: int, skip) -> bool:
    """Whether line ``n`` (1-based, a line of spaces) is followed by a unit row: then it is a space
    character whose tag is missing, not a sentence break."""
    following = lines[n] if n < len(lines) else ""
    return bool(following.strip()) and not skip(following)


def read_lines(path: str) -> list[str]:
    with open_text(path) as f:
        return [raw.rstrip("\r\n") for raw in text_lines(path, f)]


def units_of(line: str, join: str) -> list[str]:
    """The units of an untagged sentence line: its words (``join`` " ") or its characters, spaces
    included (``join`` "", as KLUE NER)."""
    return line.split() if join else list(line)


def detect_layout(lines: list[str], skip, untagged_join: str | None = None) -> str:
    """``sentence`` when most content lines are ``WORDS<TAB>TAGS`` with several tags, else ``conll``
    (one unit per line: a CoNLL tag column never holds a space). With ``untagged_join`` (a predict
    file may have no tags): a file without tabs is ``sentence`` when most lines hold several units,
    unless every line ends in a tag (``word B-PER``: CoNLL columns split by spaces)."""
    content = [line for line in lines if line.strip() and not skip(line)]
    if untagged_join is not None and not any("\t" in line for line in content):
        if all(len(line.split()) >= 2 and looks_like_tag(line.split()[-1]) for line in content):
            return "conll"
        several = sum(1 for line in content if len(units_of(line, untagged_join)) >= 2)
    else:
        several = sum(1 for line in content if line.count("\t") == 1 and len(line.split("\t")[1].split()) >= 2)
    return "sentence" if content and several * 2 > len(content) else "conll"


class TagPresence:
    """A file tags every unit or, read for ``action=predict``, none: its first unit row decides,
    and a row that disagrees is an error naming both lines."""

    def __init__(self, path: str):
        self.path, self.first = path, None

    def check(self, n: int, tagged: bool) -> None:
        if self.first is None:
            self.first = (n, tagged)
        elif tagged != self.first[1]:
            raise DataError(self.path, n, f"{'a tag' if tagged else 'no tag'}, but line {self.first[0]} has "
                                          f"{'none' if tagged else 'one'} (tag every unit or none)")


class Warnings:
    """One-line warnings naming file and line, the first few of each kind, then a count."""

    def __init__(self):
        self.counts: Counter = Counter()

    def warn(self, kind: str, where: str, what: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_WARNINGS:
            log(f"warning: {where}: {what}")

    def summary(self, source: str) -> None:
        for kind, n in self.counts.items():
            if n > MAX_WARNINGS:
                log(f"warning: {source}: {n} × {kind} in all (first {MAX_WARNINGS} shown)")


def location(ex: dict, unit: int = 0) -> str:
    """``file:line`` of a unit read from a file (one unit per line), ``source row N`` for hub rows."""
    if "line" in ex and ex.get("layout") == "sentence":  # the whole sentence is on one line
        return f"{ex['source']}:{ex['line']}" + (f" (word {unit + 1})" if unit else "")
    if "line" in ex:
        return f"{ex['source']}:{ex['line'] + unit}"
    return f"{ex.get('source', '?')} row {ex.get('row', '?')}" + (f" (unit {unit})" if unit else "")


def orphan_and_space_checks(ex: dict, warnings: Warnings) -> None:
    """``I-X`` with no ``B-X``/``I-X`` before it, and entities that start on a space (which KLUE's
    scoring, dropping spaces, turns into an ``I-X`` orphan): counted and reported, kept as is."""
    prev = "O"
    for k, (unit, tag) in enumerate(zip(ex["units"], ex["tags"])):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            warnings.warn("I-X with no B-X", location(ex, k),
                          f"sentence {ex['id']}: {tag} follows {prev} (kept; strict scoring ignores it)")
        if tag.startswith("B-") and unit.isspace():
            warnings.warn("entity starting on a space", location(ex, k),
                          f"sentence {ex['id']}: {tag} on a space; scoring drops spaces, so this "
                          "entity only counts if its next character is tagged B-")
        prev = tag


# ---- alignment (pure functions of plain lists; the round-trip tests pin them) ----------------
@dataclass
class Layout:
    """Where each unit lies in the raw text."""

    text: str
    char_unit: list[int]   # per character: its unit, -1 for joiners between units
    unit_first: list[int]  # per unit: its first non-space character (its first character if all space)


def layout(units: list[str], join: str) -> Layout:
    parts, char_unit, unit_first, pos = [], [], [], 0
    for u, unit in enumerate(units):
        if u and join:
            parts.append(join)
            char_unit.extend([-1] * len(join))
            pos += len(join)
        parts.append(unit)
        char_unit.extend([u] * len(unit))
        first = next((k for k, ch in enumerate(unit) if not ch.isspace()), 0)
        unit_first.append(pos + first)
        pos += len(unit)
    return Layout("".join(parts), char_unit, unit_first)


@dataclass
class Alignment:
    """Which characters each token position covers (-1 for specials and tokens that add nothing)."""

    token_start: list[int]  # first non-space character of the token
    token_end: list[int]    # one past its last character
    char_limit: int         # characters from here on were cut by max_length (predicted O)


def align(text: str, offsets: list[tuple[int, int]], special: list[bool], truncated: bool) -> Alignment:
    starts, ends, last_end = [], [], 0
    for (s, e), is_special in zip(offsets, special):
        first = s
        while first < e and text[first].isspace():  # SentencePiece-style tokens carry their space
            first += 1
        # a token whose characters an earlier token already started (byte-level pieces of one
        # character) adds nothing: the earlier one speaks for them
        if is_special or first >= e or first < last_end:
            starts.append(-1)
            ends.append(-1)
            continue
        starts.append(first)
        ends.append(e)
        last_end = e
    rest_has_text = any(not ch.isspace() for ch in text[last_end:])
    return Alignment(starts, ends, last_end if truncated and rest_has_text else len(text))


def char_slots(text: str, al: Alignment) -> list[tuple[int, int, int, int]]:
    """(character, token position, index from the token's start, index from its end) for every
    non-space character a token covers: the label slots of ``decode=char``."""
    slots = []
    for t, (s, e) in enumerate(zip(al.token_start, al.token_end)):
        if s < 0:
            continue
        for c in range(s, e):
            if not text[c].isspace():
                slots.append((c, t, c - s, e - 1 - c))
    return slots


def is_label_slot(c: int, lay: Layout, label_all: bool) -> bool:
    """Whether a token (or character) starting at character ``c`` carries a training tag: where
    its unit starts, or anywhere inside one with ``label_subwords=all`` (the same with tags or without)."""
    u = lay.char_unit[c]
    return u >= 0 and (label_all or c == lay.unit_first[u])


def char_label(c: int, lay: Layout, tags: list[str], label_all: bool) -> str | None:
    """Training tag of character ``c``: its unit's tag where the unit starts, else (inside a
    multi-character unit) its continuation with ``label_subwords=all``, else nothing."""
    if not is_label_slot(c, lay, label_all):
        return None
    u = lay.char_unit[c]
    return tags[u] if c == lay.unit_first[u] else continuation(tags[u])


def fill_uncovered(char_tags: list[str | None], text: str, char_limit: int) -> list[str]:
    """Tags for characters no token covers: past ``char_limit`` O (truncated); otherwise (spaces,
    characters the tokenizer dropped) I-X when the characters on both sides are in entity X."""
    n = len(char_tags)
    next_tag: list[str | None] = [None] * (n + 1)
    for c in range(n - 1, -1, -1):
        next_tag[c] = char_tags[c] if char_tags[c] is not None else next_tag[c + 1]
    out: list[str] = []
    prev = "O"
    for c, tag in enumerate(char_tags):
        if tag is None:
            after = next_tag[c + 1] if c + 1 < char_limit else None
            inside = prev[:2] in ("B-", "I-") and after == "I-" + prev[2:]
            tag = continuation(prev) if c < char_limit and inside else "O"
        out.append(tag)
        prev = tag
    return out


def unit_tags(char_tags: list[str], lay: Layout) -> list[str]:
    return [char_tags[c] if c < len(char_tags) else "O" for c in lay.unit_first]


def unit_offsets(units: list[str], join: str) -> list[tuple[int, int]]:
    """Each unit's (start, end) character offsets in ``join.join(units)``."""
    out, pos = [], 0
    for u, unit in enumerate(units):
        pos += len(join) if u else 0
        out.append((pos, pos + len(unit)))
        pos += len(unit)
    return out


def predicted_entities(units: list[str], join: str, tags: list[str]) -> list[dict]:
    """The entities in IOB2 ``tags`` (one per unit) as ``pipeline(aggregation_strategy="simple")``
    groups them: a ``B-X`` starts one, ``I-X`` continues an ``X`` entity (or starts one after
    anything else), ``O`` ends it. Each: its type, its text and its character offsets in
    ``join.join(units)`` (spaces at its edges left out)."""
    text, offsets = join.join(units), unit_offsets(units, join)
    groups: list[list] = []  # [type, first unit, last unit]
    prev = "O"
    for u, tag in enumerate(tags):
        if tag.startswith("B-") or (tag.startswith("I-") and prev[2:] != tag[2:]):
            groups.append([tag[2:], u, u])
        elif tag.startswith("I-"):
            groups[-1][2] = u
        prev = tag if tag[:2] in ("B-", "I-") else "O"
    out = []
    for typ, first, last in groups:
        start, end = offsets[first][0], offsets[last][1]
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            out.append({"type": typ, "text": text[start:end], "start": start, "end": end})
    return out


def entity_spans(tags: list[str], keep: list[int]) -> set[tuple[str, int, int]]:
    """Strict IOB2 entities (as scored: over the kept units) as (type, first unit, last unit + 1)
    in unit indices; the same chunking as metrics_spans.ner_entity_f1."""
    chunks = metrics_spans.strict_iob2_entities([tags[k] for k in keep], 0)
    return {(typ, keep[i], keep[j - 1] + 1) for _, typ, i, j in chunks}


def inexpressible_entities(outputs: list[list[str]], meta: dict, examples: list[dict], kept: list[list[int]],
                           join: str, decode_mode: str) -> dict:
    """The ceiling's report of gold entities the decoded gold labels lose, and why: ``meta`` holds the
    features' token_start, token_end, char_limit and unk_spans columns; ``kept``, each example's
    scored units (tasks/ner.py's TokenTask.ceiling)."""
    reasons: Counter = Counter()
    shown: list[str] = []
    n_gold = n_spurious = 0
    for i, (out, ex) in enumerate(zip(outputs, examples)):
        keep = kept[i]
        gold = entity_spans(ex["tags"], keep)
        pred = entity_spans(out, keep)
        n_gold += len(gold)
        n_spurious += len(pred - gold)
        lay = layout(ex["units"], join)
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
    lines = [f"ceiling ({decode_mode} decode): {lost} of {n_gold} gold entities inexpressible, "
             f"{n_spurious} spurious"]
    lines += [f"  {n:6d}  {why}" for why, n in reasons.most_common()]
    lines += [f"  e.g. {s}" for s in shown]
    return {"decode": decode_mode, "gold_entities": n_gold, "inexpressible": lost,
            "spurious": n_spurious, "reasons": dict(reasons), "examples": shown, "lines": lines}
