"""Reading token-tagging files: CoNLL columns (a unit per line, a blank line between sentences), one
sentence per line (``WORDS<TAB>TAGS``), KLUE NER's TSV and the hub's KLUE NER rows. The readers
check each line's shape and say what is wrong in one line naming the file and line; which tag scheme
a file's tags are written in is read here, the label set and the scheme setting are the task's
(tasks/ner.py)."""
from __future__ import annotations

import os
from typing import Any, Callable

from kotune.core.errors import DataError
from kotune.core.log import log
from tasks.tagging import (TagPresence, Warnings, detect_scheme, inside_sentence, orphan_and_space_checks, tag_parts,
                           units_of)

# the task's check of one tag read: (path, line or row, tag), raising DataError
CheckTag = Callable[[str, Any, str], None]


# ---- CoNLL columns and sentences per line: (first line, units, tags or None, line of each unit) --
def read_conll(path: str, lines: list[str], labelled: bool, columns: dict, join: str,
               is_comment: Callable[[str], bool]) -> list:
    """One unit per line, columns split by tab (or by whitespace when the line has no tab),
    blank line between sentences: (first line, units, tags, line of each unit) per sentence;
    unlabelled, the unit alone on its line (tags None)."""
    token_col, tag_col = int(columns.get("token", 0)), int(columns.get("tag", -1))
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
            if line and units and inside_sentence(lines, n, is_comment):
                if labelled or join:
                    raise DataError(path, n, "no tag (a space character without its tag? a blank line "
                                             "between sentences must be empty)")
                presence.check(n, False)  # a space character of an untagged character file
                units.append(line)
                unit_lines.append(n)
                continue
            close()
            continue
        if is_comment(line):
            continue
        row = line.split("\t") if "\t" in line else line.split()
        if len(row) < 2 and labelled:
            raise DataError(path, n, f"no tag (a unit{' or a space' if join == '' else ''} alone; "
                                     f"expected UNIT<TAB>TAG)")
        presence.check(n, len(row) >= 2)
        if len(row) < 2:
            units.append(row[0])
            unit_lines.append(n)
            continue
        n_cols = n_cols or len(row)
        unit, tag = _conll_unit_and_tag(path, n, row, n_cols, token_col, tag_col, join)
        units.append(unit)
        tags.append(tag)
        unit_lines.append(n)
    close()
    return sentences


def _conll_unit_and_tag(path: str, n: int, row: list[str], n_cols: int, token_col: int, tag_col: int,
                        join: str) -> tuple[str, str]:
    """The unit and tag of a tagged CoNLL line (``row``: its columns), checked."""
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
    if not unit or (join and unit.isspace()):
        raise DataError(path, n, f"empty unit {unit!r}")
    return unit, tag


def read_sentences(path: str, lines: list[str], labelled: bool, join: str,
                   is_comment: Callable[[str], bool]) -> list:
    """One sentence per line: space-separated words, a tab, as many space-separated tags;
    unlabelled, the sentence alone (words for ``task.join=" "``, else characters; tags None)."""
    sentences = []
    presence = TagPresence(path)
    for n, line in enumerate(lines, 1):
        if not line.strip() or is_comment(line):
            continue
        if "\t" not in line and not labelled:
            presence.check(n, False)
            if sentences == []:  # the first plain sentence: say what a tag will belong to
                log(f"{path}: plain sentences: a tag per {'word, split on spaces' if join else 'character'} "
                    f"(task.join={join!r}); if the training file's units were segmented otherwise (e.g. "
                    "morphemes), give the same units here, one per line")
            units = units_of(line, join)
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


def file_scheme(path: str, sentences: list) -> str:
    """The tag scheme the tags of a file's tagged ``sentences`` are written in; a tag that fits no
    scheme the others fit is refused in one line naming it."""
    tags = [t for _, _, tags, _ in sentences for t in tags]
    scheme = detect_scheme(tags)
    if scheme is None:
        suffix = sum(1 for t in tags if tag_parts(t, True)) > sum(1 for t in tags if tag_parts(t, False))
        line, odd = next((n, t) for _, _, ts, ns in sentences for t, n in zip(ts, ns)
                         if t != "O" and not tag_parts(t, suffix))
        raise DataError(path, line, f"tag '{odd}' is not an entity tag like the others "
                                    f"({'X-B' if suffix else 'B-X'}): fix it, or set task.scheme=none "
                                    "to learn the tags as they are (no entity F1)")
    return scheme


# ---- KLUE NER: examples (id, units, tags) ---------------------------------------------------
def read_klue_tsv(path: str, lines: list[str], labelled: bool, is_comment: Callable[[str], bool],
                  check_tag: CheckTag) -> list[dict]:
    """KLUE's TSV (tasks/ner.py's NerTask.read_file): ``##`` comment lines, the last ``## guid<TAB>…``
    header before a sentence's rows names it, ``CHAR<TAB>TAG`` rows, a blank line between sentences;
    unlabelled, rows without their tag column."""
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
        if is_comment(line):
            close()
            if "\t" in line:
                header, header_used = (line[2:].split("\t", 1)[0].strip(), n), False
            continue
        if "\t" not in line and not line.strip():
            if line and cur is not None and inside_sentence(lines, n, is_comment):
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
        add(n, *_klue_char_and_tag(path, n, line, labelled, check_tag))
    close()
    if cur is None and not header_used and header is not None:
        warnings.warn("empty sentence", f"{path}:{header[1]}", f"sentence {header[0]} has no characters (skipped)")
    for ex in examples:
        if "tags" in ex:
            orphan_and_space_checks(ex, warnings)
    warnings.summary(path)
    return examples


def _klue_char_and_tag(path: str, n: int, line: str, labelled: bool, check_tag: CheckTag) -> tuple[str, str | None]:
    """The character and tag of a KLUE TSV row (the tag None for an untagged row), checked."""
    row = line.split("\t")
    if len(row) == 1 and not labelled:
        return line, None
    if len(row) == 1 or not row[1].strip():
        raise DataError(path, n, "no tag (expected CHAR<TAB>TAG)")
    if len(row) != 2:
        raise DataError(path, n, f"{len(row)} tab-separated columns, expected 2 (CHAR<TAB>TAG)")
    char, tag = row[0], row[1].strip()
    if not char:
        raise DataError(path, n, "empty character column")
    check_tag(path, n, tag)
    return char, tag


def read_klue_hub(rows, path: str, columns: Any, check_tag: CheckTag) -> list[dict]:
    """Hub rows (``klue/klue`` ``ner``): ``tokens`` are characters (spaces included), ``ner_tags``
    class ids translated by the hub's own label names (``columns``: the task's ``hub.columns``)."""
    cols = columns
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
            check_tag(path, f"row {i}", t)
        ex = {"id": str(row.get("guid", i)), "source": path, "row": i, "units": list(units), "tags": tags}
        orphan_and_space_checks(ex, warnings)
        examples.append(ex)
    warnings.summary(path)
    return examples
