"""``action=serve``'s connections: uvicorn's h11 protocol with the limits it lacks (kotune/serving/app.py
builds the server with it).

- a request's head (request line and headers) must be in ``serve.header_timeout_s`` after the connection
  opens, or after the first byte of a kept-alive connection's next request: else the connection is
  closed (uvicorn closes an idle kept-alive connection, but never one that has sent nothing, or a head
  byte by byte);
- at most ``serve.max_connections`` open at once: past it a new connection is answered 503 (JSON) at
  once and closed (uvicorn's ``limit_concurrency`` answers only a request, so idle sockets held the
  descriptors);
- a connection closed while its client is still sending a body (the 413 of a body too large, the 408
  of a slow one) is closed lingering: the answer, then end-of-stream, then the rest of the body is
  read and dropped for up to ``serve.body_timeout_s`` (and a bound in bytes), so that the client reads
  the answer instead of a reset;
- the event loop's handler for ``accept()`` out of descriptors (``ulimit -n``): a warning at most every
  few seconds while asyncio waits a second and accepts again, never an exit."""
from __future__ import annotations

import asyncio
import errno
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kotune.core.log import warn
from kotune.serving.requests import error_body

OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # asyncio's accept() retries on these
SHED_LINGER_S = 1.0  # a connection answered 503 at once: how long what it sent is read and dropped
HEAD_BYTES = 65536   # ... and how much of it


@dataclass
class ConnectionLimits:
    header_timeout_s: float
    max_connections: int
    linger_s: float       # reading the rest of a refused body, at most this long
    linger_bytes: int     # ... and this many bytes
    stats: dict = field(default_factory=dict)  # shed_connections, header_timeouts (GET /health, results.json)
    warned: dict = field(default_factory=dict)  # what was warned about, when

    def __post_init__(self) -> None:
        self.stats.setdefault("shed_connections", 0)
        self.stats.setdefault("header_timeouts", 0)

    def warn_now_and_then(self, what: str, message: str, every_s: float = 10.0) -> None:
        """A warning at most every ``every_s`` seconds per ``what`` (a flood would be a line per connection)."""
        now = time.monotonic()
        if now - self.warned.get(what, -every_s) >= every_s:
            self.warned[what] = now
            warn(message)


def shed_answer(max_connections: int) -> bytes:
    """The raw 503 a connection over the cap gets before any request is read (h11 answers requests only)."""
    body = error_body(f"too many connections (serve.max_connections={max_connections}); retry")
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nretry-after: 1\r\nconnection: close\r\n\r\n" + body)


class _LingeringTransport:
    """The transport uvicorn's request cycle writes to, whose ``close()`` is the protocol's lingering close."""

    def __init__(self, transport: asyncio.Transport, protocol: "LimitedH11Protocol"):
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        self._protocol.close_lingering()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a head time limit, a connection cap and a lingering close (the
    module's docstring); ``limits`` is set by :func:`protocol_class`."""

    limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.real_transport, self.lingering, self.linger_left = transport, False, 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        limits = self.limits
        if len(self.connections) >= limits.max_connections:
            # not in server_state.connections: nothing of uvicorn's waits on it or counts it
            self.transport = transport
            limits.stats["shed_connections"] += 1
            limits.warn_now_and_then("shed", f"serve.max_connections={limits.max_connections} connections open: "
                                             "new ones are answered 503")
            transport.write(shed_answer(limits.max_connections))
            self.linger(SHED_LINGER_S, HEAD_BYTES)
            return
        super().connection_made(transport)
        self.transport = _LingeringTransport(transport, self)  # type: ignore[assignment]
        self.arm_head_timer()

    # ---- the head's time limit ----
    def arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.head_timed_out)

    def cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def waiting_for_a_request(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def head_timed_out(self) -> None:
        self.head_timer = None
        if self.real_transport.is_closing() or self.lingering or not self.waiting_for_a_request():
            return
        self.limits.stats["header_timeouts"] += 1
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:  # h11 in a state that cannot close: the socket closes all the same
            pass
        self.real_transport.close()

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # the rest of a refused body: dropped
            self.linger_left -= len(data)
            if self.linger_left <= 0:
                self.real_transport.close()
            return
        if self.head_timer is None and self.waiting_for_a_request():
            self.arm_head_timer()  # a kept-alive connection's next request: its head has the same limit
        super().data_received(data)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's head is in: its body has serve.body_timeout_s (the guard)
            self.cancel_head_timer()

    # ---- closing ----
    def close_lingering(self) -> None:
        """Close; lingering when the client is still sending a body (it would get a reset, not the answer)."""
        if self.lingering or self.real_transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:
            self.linger(self.limits.linger_s, self.limits.linger_bytes)
        else:
            self.real_transport.close()

    def linger(self, seconds: float, max_bytes: int) -> None:
        """End-of-stream after what was written, then read and drop for up to ``seconds`` and
        ``max_bytes``; the client's own close (or either bound) closes the socket."""
        self.lingering, self.linger_left = True, max_bytes
        self.cancel_head_timer()
        transport = self.real_transport
        if transport.can_write_eof():
            transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()
        transport.resume_reading()
        self.linger_timer = self.loop.call_later(seconds, transport.close)

    def shutdown(self) -> None:
        if self.lingering:
            self.real_transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_head_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        super().connection_lost(exc)


def protocol_class(limits: ConnectionLimits) -> type[LimitedH11Protocol]:
    """The protocol class uvicorn builds a connection with (``uvicorn.Config(http=...)``)."""
    return type("KotuneH11Protocol", (LimitedH11Protocol,), {"limits": limits})


def accept_error_handler(limits: ConnectionLimits) -> Callable[[asyncio.AbstractEventLoop, dict], None]:
    """The event loop's exception handler: ``accept()`` out of descriptors (asyncio stops accepting
    for a second and tries again) is a warning now and then; anything else goes to asyncio's own
    handler, whose failure (logging that needs a descriptor itself) is dropped, not raised out of the loop."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        try:
            if isinstance(error, OSError) and error.errno in OUT_OF_RESOURCES:
                limits.warn_now_and_then("accept", f"accepting a connection: {error.strerror} "
                                                   f"(ulimit -n, serve.max_connections={limits.max_connections}); "
                                                   "new connections wait, accepting again in 1 s")
            else:
                loop.default_exception_handler(context)
        except Exception:  # noqa: BLE001 - nowhere left to report it; the loop must go on
            pass

    return handle
