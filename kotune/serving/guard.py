"""The ASGI guard in front of the served app: ``Authorization: Bearer`` when an API key is set,
body size and time limits, a JSON answer for every error it gives (kotune/serving/app.py)."""
from __future__ import annotations

import asyncio
import hmac
import ipaddress

from omegaconf import DictConfig

from kotune.serving.requests import error_body, error_id
from kotune.core.log import logger, warn


API_KEY_ENV = "KOTUNE_API_KEY"


# ---- the ASGI guard -------------------------------------------------------------------------
async def send_json(send, status: int, body: bytes, headers: dict | None = None) -> None:
    extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})


def guard(app, max_body_bytes: int, body_timeout_s: float, api_key: str | None):
    """ASGI middleware in front of the app: ``Authorization: Bearer <serve.api_key>`` when a key is
    set (401), a body over ``max_bytes`` (declared or streamed: 413, unread), a body still arriving
    ``body_timeout_s`` after its request began (408, the connection closed), and a JSON 500 (or 503
    when the server cancels it) for whatever escapes the app."""
    from starlette.exceptions import HTTPException

    key = api_key.encode("utf-8") if api_key else None

    async def guarded(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if key is not None:
            given = headers.get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), key):
                return await send_json(send, 401, error_body("missing or wrong API key: send Authorization: Bearer "
                                                             "<serve.api_key>"), {"www-authenticate": "Bearer"})
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return await send_json(send, 413, error_body(f"request body over serve.max_body_bytes={max_body_bytes}"),
                                   {"connection": "close"})
        loop = asyncio.get_running_loop()
        deadline, received, complete = loop.time() + body_timeout_s, 0, False

        async def limited_receive():
            nonlocal received, complete
            if complete:  # the body is in: what follows is the wait for a disconnect, untimed
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"request body not complete after serve.body_timeout_s={body_timeout_s:g}",
                                    headers={"connection": "close"}) from None
            if message["type"] != "http.request" or not message.get("more_body"):
                complete = True
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > max_body_bytes:
                raise HTTPException(413, f"request body over serve.max_body_bytes={max_body_bytes}",
                                    headers={"connection": "close"})
            return message

        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, limited_receive, tracked_send)
        except asyncio.CancelledError:  # the server's grace period ran out before this request finished
            if started:
                raise
            warn(f"{scope.get('method')} {scope.get('path')}: stopped by the shutdown (503)")
            await send_json(send, 503, error_body("the server is shutting down; retry"), {"connection": "close"})
        except Exception as e:  # noqa: BLE001 - answered as JSON, logged once
            if started:  # the app answered already (its 500 handler), then re-raised
                return
            eid = error_id()
            logger.error(f"error [{eid}]: {scope.get('method')} {scope.get('path')}: {type(e).__name__}: {e}",
                         exc_info=e)


            await send_json(send, 500, error_body(f"internal error {eid}: {type(e).__name__}", id=eid))

    return guarded


def body_limit(app, max_bytes: int):
    """A body over ``max_bytes`` gets 413 (the guard without a key or a body time limit)."""
    return guard(app, max_bytes, 3600.0, None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_api_key(cfg: DictConfig, environ: dict) -> str | None:
    """``serve.api_key``, else the environment's ``KOTUNE_API_KEY``; None (no key) when neither is set."""
    key = cfg.serve.get("api_key")
    key = str(key) if key not in (None, "") else environ.get(API_KEY_ENV) or None
    return key
