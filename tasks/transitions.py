"""Which tag may follow which in IOB2 (``task.crf``): the moves a CRF's transition scores forbid, and
label sequences repaired to obey them. Pure functions of tag names and lists of tags.

IOB2 forbids ``I-X`` anywhere but after ``B-X`` or ``I-X``: not at the start, not after ``O``, not
after a tag of another type. Tag sets without entity tags (``task.scheme=none``: POS tags) get no
constraints.
"""
from __future__ import annotations


def _inside_type(tag: str) -> str | None:
    return tag[2:] if tag.startswith("I-") else None


def may_follow(previous: str, tag: str) -> bool:
    """Whether ``tag`` may follow ``previous`` in IOB2."""
    typ = _inside_type(tag)
    return typ is None or previous in (f"B-{typ}", f"I-{typ}")


def bio_constraints(labels: list[str], scheme: str | None = "iob2") -> dict[str, list]:
    """The forbidden moves between ``labels`` (indices): ``start`` (tags that cannot open a
    sentence) and ``transitions`` ([from, to] pairs); none when ``scheme`` is ``none``."""
    if scheme == "none":
        return {"start": [], "transitions": []}
    start = [j for j, tag in enumerate(labels) if _inside_type(tag) is not None]
    moves = [[i, j] for i, prev in enumerate(labels) for j, tag in enumerate(labels) if not may_follow(prev, tag)]
    return {"start": start, "transitions": moves}


def repair_bio(tags: list[str]) -> tuple[list[str], int]:
    """``tags`` made valid IOB2 by opening each orphan ``I-X`` as ``B-X``, and how many were
    changed. Gold tags read per token can break IOB2 where an entity starts inside a token (the
    token takes its first character's ``O``, the next one ``I-X``); a CRF whose transitions forbid
    that move would give such a sentence an infinite loss."""
    out, changed, previous = [], 0, "O"
    for tag in tags:
        if not may_follow(previous, tag):
            tag, changed = "B-" + tag[2:], changed + 1
        out.append(tag)
        previous = tag
    return out, changed
