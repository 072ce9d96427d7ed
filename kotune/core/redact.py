"""Credentials out of everything kotune writes or logs.

A secret setting is masked BY ITS KEY, as a whole value, wherever a config is written: a key named
like a secret (``serve.api_key``, ``*.token``, ``password``: :func:`secret_name`) loses its value
whatever the value holds (spaces, quotes, ``#``, a leading ``null``), and a storage URL
(``hparams_search.storage``, ``hydra.sweeper.storage``: :func:`url_key`) loses its password and its
secret query parameters (:func:`mask_url`). An override ``key=value`` is masked by its key too
(:func:`mask_override`). The values found so are remembered (:func:`remember_secrets`; by the job that
met them, :func:`job_secrets`, or the process, outside any job), and free
text (a log line, a database driver's error that parsed the URL its own way and names a piece of
the password as a host) has each remembered value masked, besides the patterns that catch what was
never seen as a setting: a URL's ``user:pw@``, ``?password=…``, ``api_key=…`` (:func:`mask_credentials`).

SQLAlchemy's ``make_url(url).render_as_string(hide_password=True)`` covers the plain
``user:pw@host`` form only: it leaves ``?password=…`` in clear and splits a password holding a raw
``@`` at its first one (``u:p@ss@host`` → ``u:***@ss@host``), so the authority is split here at its
last ``@``, as a browser does."""
from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus

MASK = "***"
# a setting whose name says it is a secret (serve.api_key, a Hub token, a password): the last name of
# the key must be one of these. A bare `token` is not: task.columns.token is a column's index, and
# tokenizer entries (mask_token, pad_token) are no secrets either
SECRET_NAMES = ("api_key", "apikey", "api_token", "password", "passwd", "pwd", "secret", "access_token", "auth_token",
                "hf_token", "hub_token", "client_secret", "private_key")
URL_NAMES = ("storage",)  # settings holding a database URL whose password is a secret (hparams_search.storage)
SECRET_ENV = ("KOTUNE_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # environment variables holding a secret
MIN_KNOWN = 5  # a remembered value shorter than this is not looked for in free text (it would mask common words)
MIN_PIECE = 5  # nor a piece of a URL's password that another parser may show on its own (a "host" past an '@')

# scheme://rest, rest up to white space, a quote or a bracket a URL cannot end with in a config dump
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)([^\s'\"<>\]\[{}]+)")
# query parameters that carry a secret (libpq's password, drivers' token/key spellings); the first
# one follows '?', the others '&' or ';'; the value runs to the next `&name=` (a raw '#', '&' or ';'
# in a password is the password's, not a fragment or another parameter)
_SECRET_PARAM = re.compile(r"([?&;](?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)"
                           r"((?:[^&;]|[&;](?![\w.\-]+=))*)", re.IGNORECASE)
# in free text, `name=value` / `name: value` / `"name": "value"`: a quoted value whole, else up to white
# space, a quote, a closing bracket or the next `&name=` query parameter; null / None / ~ alone are no secret
_SECRET_SETTING = re.compile(
    r"\b((?:%s)[\"']?\s*[=:]\s*)(\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'"
    r"|(?!(?:null|None|~)(?=[\s\"',}\]]|$))(?:[^\s\"',}\]&;]|[&;](?![\w.]+=))+)"
    % "|".join(SECRET_NAMES), re.IGNORECASE)
# Hydra's job.override_dirname: overrides joined by ',', not one override (the patterns mask it)
JOINED_OVERRIDES = ("override_dirname",)
_OVERRIDE = re.compile(r"([+~]{0,2})([\w.\-/@]+)(=)(.*)", re.DOTALL)
_PIECES = re.compile(r"[@/:?#&;=]")

# The secret values met so far (:func:`remember_secrets`): a job's own while it runs (:func:`job_secrets`),
# forgotten when it ends, so that a later job of the same process (a notebook's) shows its plain words;
# those met outside any job (the command line's overrides, a sweep's storage) for the whole process.
_process: set[str] = set()
_job: set[str] | None = None
_known: frozenset[str] = frozenset()  # both, replaced whole: a log line in another thread reads one or the other


def secret_name(key: object) -> bool:
    """Whether a setting (``serve.api_key``, ``api_key``) holds a secret by its name."""
    return str(key).lower().rsplit(".", 1)[-1] in SECRET_NAMES


def url_key(key: object) -> bool:
    """Whether a setting (``hparams_search.storage``) holds a URL whose password is a secret."""
    return str(key).lower().rsplit(".", 1)[-1] in URL_NAMES


def _unquoted(value: str) -> tuple[str, str, str]:
    """A value written on a command line or in YAML, without its outer quotes: (open, inner, close)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[0], value[1:-1], value[-1]
    return "", value, ""


def _split_url(url: str) -> tuple[str, str, str, str] | None:
    """A whole URL as (scheme://, user, password or None, rest from the host on), the userinfo ending
    at the LAST '@': a password may hold '@', '/', '?', '#' (a query holding '@' is over-masked, never
    a password shown)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
        return None
    at = rest.rfind("@")
    if at < 0:
        return scheme + sep, "", None, rest
    user, colon, password = rest[:at].partition(":")
    if "/" in user:  # 'host:443/a@b' is a path holding '@', not a user
        return scheme + sep, "", None, rest
    return scheme + sep, user, password if colon else None, rest[at:]


def mask_url(value: object) -> str:
    """A setting's whole value known to be a URL (``hparams_search.storage``), its password and secret
    query parameters masked, whatever characters they hold (spaces, quotes, '@', '/')."""
    open_, url, close = _unquoted(str(value))
    parts = _split_url(url)
    if parts is None:
        return str(value)
    scheme, user, password, rest = parts
    rest = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)
    return f"{open_}{scheme}{user}{':' + MASK if password is not None else ''}{rest}{close}"


def url_secrets(value: object) -> list[str]:
    """The secret parts of a whole URL: its password and its secret query parameters' values."""
    parts = _split_url(_unquoted(str(value))[1])
    if parts is None:
        return []
    found = [parts[2]] if parts[2] else []
    return found + [m.group(2) for m in _SECRET_PARAM.finditer(parts[3]) if m.group(2)]


def mask_override(text: str) -> str:
    """An override ``[+~]key=value`` with the value masked by its key (the whole of it, for a secret;
    a URL's password, for a storage); any other text as it is."""
    m = _OVERRIDE.fullmatch(text)
    if not m:
        return text
    prefix, key, eq, value = m.groups()
    if secret_name(key) and value not in ("", "null"):
        return f"{prefix}{key}{eq}{MASK}"
    if url_key(key):
        return f"{prefix}{key}{eq}{mask_url(value)}"
    return text


def _variants(value: str) -> set[str]:
    """The forms a value takes once written: URL-encoded or decoded, JSON- or repr-escaped, in a
    single-quoted YAML string."""
    forms = {value, unquote(value), unquote_plus(value), quote(value, safe=""), quote_plus(value, safe=""),
             json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1], repr(value)[1:-1],
             value.replace("'", "''")}
    return {f for f in forms if len(f) >= MIN_KNOWN}


def _pieces(password: str) -> set[str]:
    """Every span of a URL's password between two of its delimiters ('@', '/', ':', '?', '#', '&',
    ';', '='), or an end: what a parser splitting it there can show on its own."""
    cuts = [-1] + [m.start() for m in _PIECES.finditer(password)][:64] + [len(password)]
    return {password[a + 1:b] for i, a in enumerate(cuts) for b in cuts[i + 1:] if b - a - 1 >= MIN_PIECE}


@contextlib.contextmanager
def job_secrets() -> Iterator[None]:
    """The secrets remembered while the block runs (a job) are masked in every line and file as long
    as it runs, and forgotten when it ends; a block inside it is the same job. An exception leaving
    the job keeps them: its text, printed after the job, may quote them."""
    global _job, _known
    if _job is not None:
        yield
        return
    _job = set()
    try:
        yield
    except BaseException:
        _process.update(_job)
        raise
    finally:
        _job = None
        _known = frozenset(_process)


def _learn(values: set[str]) -> None:
    global _known
    (_process if _job is None else _job).update(values)
    _known = _known | values


def remember_secrets(values: list[object], url: bool = False) -> None:
    """Remember secret values, to be masked wherever they appear in free text later (log lines,
    exception text). ``url``: the values are a URL's password or query values, whose pieces between
    '@', '/', ':' another parser (SQLAlchemy splits at the first '@') may show on their own."""
    for value in values:
        if value is None or isinstance(value, (dict, list, tuple)):
            continue
        text = _unquoted(str(value))[1]
        if text in ("", "null", "None", MASK):
            continue
        _learn(_variants(text) | (_pieces(unquote(text)) if url else set()))


def remember_override(text: str) -> None:
    """Remember the secret an override ``key=value`` sets, by its key."""
    m = _OVERRIDE.fullmatch(text)
    if not m:
        return
    key, value = m.group(2), m.group(4)
    if secret_name(key):
        remember_secrets([value])
    elif url_key(key):
        remember_secrets(url_secrets(value), url=True)


def remember_tree(value: Any, key: str = "") -> None:
    """Remember every secret in a config-like tree (dicts, lists; an override string in a list),
    by key: a secret setting's value, a storage URL's password."""
    if isinstance(value, dict):
        for k, v in value.items():
            remember_tree(v, str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            remember_tree(v, key)
    elif secret_name(key):
        remember_secrets([value])
    elif url_key(key) and isinstance(value, str):
        remember_secrets(url_secrets(value), url=True)
    elif isinstance(value, str) and key not in JOINED_OVERRIDES:
        remember_override(value)


def remember_environment(environ: Any = None) -> None:
    """Remember the secrets the environment holds for kotune (``KOTUNE_API_KEY``, a Hub token)."""
    environ = os.environ if environ is None else environ
    remember_secrets([environ.get(name) for name in SECRET_ENV])


def _mask_url_in_text(match: re.Match) -> str:
    scheme, rest = match.group(1), match.group(2)
    # the userinfo ends at the last '@' before any query or fragment: a password may hold '@' or '/'
    query = min([i for i in (rest.find("?"), rest.find("#")) if i >= 0], default=len(rest))
    at = rest.rfind("@", 0, query)
    if at >= 0 and ":" in rest[:at]:
        user = rest[:at].split(":", 1)[0]
        if "/" not in user:  # 'host:443/a@b' is a path holding '@', not a user
            rest = f"{user}:{MASK}{rest[at:]}"
    return scheme + _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)


def mask_credentials(text: object) -> str:
    """``text`` with every remembered secret value masked (longest first), then the password of every
    URL in it (``user:pw@``, ``:pw@``, a password holding ``@``, ``?password=`` / ``&token=``-style
    parameters) and the value of every setting named like a secret (``serve.api_key=…``). A value
    that is not a string is written as one (the sweeper masks settings of any type)."""
    text = str(text)
    for secret in sorted((s for s in _known if s in text), key=len, reverse=True):
        text = text.replace(secret, MASK)
    if "://" in text:
        text = _URL.sub(_mask_url_in_text, text)
    return _SECRET_SETTING.sub(lambda m: m.group(1) + MASK, text)


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {mask_credentials(k) if isinstance(k, str) else k: _mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(v, key) for v in value]
    if secret_name(key) and value not in (None, "") and not isinstance(value, bool):
        return MASK
    if isinstance(value, str):
        if url_key(key):
            value = mask_url(value)
        elif key not in JOINED_OVERRIDES:
            value = mask_override(value)
        return mask_credentials(value)
    return value


def mask_tree(value: Any) -> Any:
    """A config-like value (dicts, lists, strings; a parsed ``.hydra/*.yaml``, a results file) with
    every secret masked by its key: a secret setting's whole value (of any type), a storage URL's
    password, an override ``key=value`` naming a secret; the values so found are remembered first,
    so a string elsewhere in it holding one (Hydra's ``override_dirname``) is masked too. Every other
    string goes through :func:`mask_credentials`; keys too (a dict keyed by an override)."""
    remember_tree(value)
    return _mask(value)
