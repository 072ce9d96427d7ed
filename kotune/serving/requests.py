"""What a served request may be: its items checked one by one before any joins a batch (a lone
surrogate, a NUL, a text over ``serve.max_text_chars``, an unknown field), and the errors a request is
answered with (:class:`RequestError`: a status and one JSON line, naming the item at fault)."""
from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictStr, create_model

from kotune.core.errors import DataError


# ---- errors ---------------------------------------------------------------------------------
class RequestError(Exception):
    """A request answered with ``status`` and ``{"error": message, "index": i}`` (index: the
    item at fault, when one is)."""

    def __init__(self, status: int, message: str, index: int | None = None, headers: dict | None = None,
                 id: str | None = None):
        super().__init__(message)
        self.status, self.index, self.headers, self.id = status, index, headers, id


class ItemFailed(Exception):
    """Item ``index`` of a request failed in the model (``error``: why); logged under ``id``."""

    def __init__(self, index: int, error: BaseException, id: str):
        super().__init__(f"item {index}: {type(error).__name__}: {error}")
        self.index, self.error, self.id = index, error, id


class ShuttingDown(Exception):
    """The server is stopping: the request is refused (503) instead of run."""


def error_id() -> str:
    return uuid.uuid4().hex[:8]


def one_line(message: str) -> str:
    return (str(message).strip().splitlines() or ["error"])[0]


def error_body(message: str, **extra) -> bytes:
    return json.dumps({"error": one_line(message), **{k: v for k, v in extra.items() if v is not None}},
                      ensure_ascii=False).encode("utf-8")


# ---- requests -------------------------------------------------------------------------------
def request_model(fields: tuple[str, ...]) -> type[BaseModel]:
    """The OpenAPI schema of ``POST /predict`` for a task: one input with the task's own string fields
    (``Task.request_fields``), or a list of them in ``inputs`` (plain strings too for a single-text task).
    The body is checked by :func:`request_items`, which says what is wrong in one line."""
    strict = ConfigDict(extra="forbid")
    item = create_model("Item", __config__=strict, **{name: (StrictStr | None, None) for name in fields})
    entry = item | StrictStr if tuple(fields) == ("text",) else item
    return create_model("PredictRequest", __config__=strict, inputs=(list[entry] | None, None),  # type: ignore[valid-type]
                        **{name: (StrictStr | None, None) for name in fields})


def check_text(value: Any, name: str, max_chars: int) -> str | None:
    """What is wrong with one field's value (None: nothing): not a string, empty, a lone UTF-16
    surrogate (JSON's ``"\\ud800"``: no character, and no UTF-8 for the tokenizer), a NUL, more than
    ``max_chars`` characters."""
    if not isinstance(value, str):
        return f"{name}: a string is expected, got {type(value).__name__ if value is not None else 'null'}"
    if not value.strip():
        return f"{name}: empty"
    if len(value) > max_chars:
        return f"{name}: {len(value)} characters, over serve.max_text_chars={max_chars}"
    if "\x00" in value:
        return f"{name}: a NUL character (\\u0000) at character {value.index(chr(0))}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{name}: a lone surrogate (\\u{ord(value[e.start]):04x}) at character {e.start}; "
                "a character outside the BMP is a \\ud8xx\\udcxx pair")
    return None


def request_items(body: Any, fields: tuple[str, ...], max_items: int,
                  max_chars: int = 10**9) -> tuple[list[dict[str, str]], bool]:


    """The inputs of a parsed JSON body as dicts of ``fields``, and whether it was a single input.
    A :class:`RequestError` says what is wrong, naming the item and its index."""
    takes = ", ".join(fields)
    if not isinstance(body, dict):
        raise RequestError(422, f"body: a JSON object is expected ({{\"{fields[0]}\": ...}} or {{\"inputs\": [...]}}), "
                                f"got {type(body).__name__ if body is not None else 'null'}")
    if "inputs" not in body:
        raw, single = [body], True
    elif set(body) - {"inputs"}:
        raise RequestError(422, f"give one input ({takes}) or a list in 'inputs', not both")
    elif not isinstance(body["inputs"], list):
        raise RequestError(422, f"inputs: a list is expected, got {type(body['inputs']).__name__}")
    else:
        raw, single = body["inputs"], False
    if not raw:
        raise RequestError(422, "inputs: empty")
    if len(raw) > max_items:
        raise RequestError(413, f"{len(raw)} inputs, over serve.max_items={max_items}")
    items = []
    for i, item in enumerate(raw):
        where = "" if single else f"item {i}: "
        if isinstance(item, str) and not single:
            if fields != ("text",):
                raise RequestError(422, f"{where}a string; this task takes objects with {takes}", i)
            item = {"text": item}
        if not isinstance(item, dict):
            raise RequestError(422, f"{where}an object with {takes} is expected, got {type(item).__name__}", i)
        extra = [k for k in item if k not in fields]
        if extra:
            raise RequestError(422, f"{where}{extra[0]}: not a field; this task takes {takes}", i)
        missing = [f for f in fields if f not in item]
        if missing:
            raise RequestError(422, f"{where}{missing[0]}: missing; this task takes {takes}", i)
        for name in fields:
            wrong = check_text(item[name], name, max_chars)
            if wrong:
                raise RequestError(422, where + wrong, i)
        items.append(item)
    return items, single


def data_error(e: DataError, single: bool) -> RequestError:
    """A task's own check of a request (``request:item 3: ...``) as a 422 with the item's index."""
    where = str(e.where or "")
    index = int(where.split()[-1]) if where.startswith("item ") and where.split()[-1].isdigit() else None
    return RequestError(422, (e.what if single else f"{where}: {e.what}") if e.where else str(e), index)
