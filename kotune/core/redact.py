"""Credentials out of everything kotune writes or logs: one function masks the password of every
URL in a text (``hparams_search.storage=postgresql+psycopg://user:pw@host/db``), whatever form it
takes. SQLAlchemy's ``make_url(url).render_as_string(hide_password=True)`` covers the plain
``user:pw@host`` form only: it leaves ``?password=…`` in clear and splits a password holding a raw
``@`` at its first one (``u:p@ss@host`` → ``u:***@ss@host``), so the authority is split here at its
last ``@``, as a browser does."""
from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://rest, rest up to white space, a quote or a bracket a URL cannot end with in a config dump
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)([^\s'\"<>\]\[{}]+)")
# query parameters that carry a secret (libpq's password, drivers' token/key spellings)
_SECRET_PARAM = re.compile(r"([?&;](?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)([^&;#]*)",
                           re.IGNORECASE)


def _mask_url(match: re.Match) -> str:
    scheme, rest = match.group(1), match.group(2)
    # the userinfo ends at the last '@' before any query or fragment: a password may hold '@' or '/'
    query = min([i for i in (rest.find("?"), rest.find("#")) if i >= 0], default=len(rest))
    at = rest.rfind("@", 0, query)
    if at >= 0 and ":" in rest[:at]:
        user = rest[:at].split(":", 1)[0]
        if "/" not in user:  # 'host:443/a@b' is a path holding '@', not a user
            rest = f"{user}:{MASK}{rest[at:]}"
    return scheme + _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)


# a setting whose name says it is a secret (serve.api_key=…, api_key: … in Hydra's saved YAML,
# "password": "…" in JSON); null and empty values are not secrets
SECRET_NAMES = ("api_key", "apikey", "password", "passwd", "secret", "access_token", "auth_token")
_SECRET_SETTING = re.compile(r"\b((?:%s)[\"']?\s*[=:]\s*[\"']?)(?!null\b|None\b|[\"',}\]\s]|$)([^\s\"',}\]&;#]+)"
                             % "|".join(SECRET_NAMES), re.IGNORECASE)


def mask_credentials(text: object) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``user:pw@``, ``:pw@``,
    a password holding ``@``, ``?password=`` / ``&token=``-style parameters), and the value of
    every setting named like a secret (``serve.api_key=…``). A value that is not a string is
    written as one (the sweeper masks settings of any type)."""
    text = str(text)
    if "://" in text:
        text = _URL.sub(_mask_url, text)
    return _SECRET_SETTING.sub(lambda m: m.group(1) + MASK, text)


def secret_name(key: str) -> bool:
    return str(key).lower().rsplit(".", 1)[-1] in SECRET_NAMES


def mask_tree(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with every string passed through
    :func:`mask_credentials`; keys too (a dict keyed by an override)."""
    if isinstance(value, str):
        return mask_credentials(value)
    if isinstance(value, dict):
        return {mask_tree(k) if isinstance(k, str) else k:
                MASK if secret_name(k) and isinstance(v, str) and v else mask_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_tree(v) for v in value]
    return value
