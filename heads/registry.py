"""The head registry (kotune.core.registry.HEADS), filled by importing kotune's own heads; kept apart
from heads/__init__.py so that reading a checkpoint's JSON (heads/model/artifact.py) does not load torch.

Kinds written by older kotune (``pair``, ``token_char``, ``token_crf``, ``token_char_crf``,
``span_char``) are a head with options now: :func:`resolve` maps them (each head's ``aliases``), so
checkpoints saved before still load.
"""
from __future__ import annotations

import heads.bi_encoder  # noqa: F401  (each module registers its head: kotune.register_head)
import heads.dependency  # noqa: F401
import heads.relation  # noqa: F401
import heads.sequence  # noqa: F401
import heads.span  # noqa: F401
import heads.token  # noqa: F401
from heads.base import Head
from kotune.core.registry import HEADS

__all__ = ["HEADS", "head_class", "resolve"]


def aliases() -> dict[str, tuple[str, dict]]:
    """Old kind → (registered kind, the options it stands for), from every registered head."""
    return {old: (name, dict(options)) for name, cls in HEADS.items() for old, options in cls.aliases.items()}


def resolve(kind: str, kwargs: dict) -> tuple[str, dict]:
    """A saved ``(head kind, head arguments)`` as today's: an alias becomes its head with its options."""
    if kind not in HEADS and kind in aliases():
        name, options = aliases()[kind]
        return name, {**kwargs, **options}
    return kind, dict(kwargs)


def head_class(kind: str) -> type[Head]:
    return HEADS.get(kind)  # type: ignore[return-value]
