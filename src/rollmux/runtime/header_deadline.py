"""A deadline on a request's headers, which uvicorn does not have.

uvicorn closes a keep-alive connection that stays silent for ``timeout_keep_alive``
after a response, but any byte cancels that timer, and a new connection gets no timer at
all: a client that connects and sends nothing, or trickles a request's headers a byte at
a time, holds its connection (a file descriptor and a protocol object) for as long as it
likes, and a few thousand such clients take every descriptor the process has.

``header_deadline_protocol(timeout_s, refused)`` returns a subclass of the HTTP protocol
uvicorn would use (``httptools`` when installed, else ``h11``; or ``base``) that adds one rule: from
the moment a connection is made, and again from the end of every response, the next
request's headers must be in whole within ``timeout_s`` seconds. A connection past that
deadline is closed; if part of a request had come, it is first answered 408 with a
problem document naming ``headers`` and ``Connection: close``, and ``refused(408,
"headers", reason)`` is told (metrics and log); so is, as a 400 on ``request``, a request
that uvicorn cannot parse. A connection that sent nothing is closed
without an answer, as an idle keep-alive connection is. While a request is being
served (its headers are in, its response is not finished) the deadline does not apply:
the body has its own (``service.BodyLimit``) and a long poll may take its time.

Over https the protocol sees a connection only once its TLS handshake is over, and
asyncio gives a handshake 60 s. ``DeadlineServer`` runs uvicorn on an event loop (uvloop
when installed, as uvicorn would choose, else asyncio's) whose TLS listeners give it the
same deadline: a client that connects and sends no ClientHello, or trickles one, is cut
off after ``timeout_s`` too.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import uvicorn
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.auto import AutoHTTPProtocol

try:
    from uvloop import Loop as _BaseLoop
except ImportError:  # uvicorn's own fallback when uvloop is missing
    _BaseLoop = asyncio.SelectorEventLoop


class HeaderDeadline:
    """The header deadline of the module docstring, mixed into one of uvicorn's HTTP
    protocols by ``header_deadline_protocol``, which sets the three class attributes."""

    timeout_s: float = 10.0
    refused: Callable[[int, str, str], None] | None = None
    problem: Callable[[int, str, str], JSONResponse] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._partial = 0
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers():
            self._partial += len(data)
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn could not parse (the app never sees it): told to ``refused``
        (metrics and log) as a 400 on ``request``, then answered as uvicorn does."""
        if self.refused is not None:
            self.refused(400, "request", msg)
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        """No request is being served: the bytes that come belong to the next one's headers."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._partial = 0
        self._deadline = self.loop.call_later(self.timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return  # a request is being served; the end of its response arms the deadline again
        if self._partial:
            reason = f"not received whole within {self.timeout_s:g}s ({self._partial} bytes came)"
            if self.refused is not None:
                self.refused(408, "headers", reason)
            if self.problem is not None:
                body = self.problem(408, "headers", reason).body
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
                                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()


def header_deadline_protocol(timeout_s: float, refused: Callable[[int, str, str], None] | None = None,
                             problem: Callable[[int, str, str], JSONResponse] | None = None,
                             base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type:
    """The protocol class to give uvicorn (``Config(http=...)``): ``base`` (uvicorn's
    choice by default: httptools when installed, else h11) with headers in whole within
    ``timeout_s`` seconds; ``refused`` hears of each 408, ``problem`` makes its body."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: expected seconds > 0")
    return type(f"HeaderDeadline{base.__name__}", (HeaderDeadline, base),
                {"timeout_s": timeout_s, "refused": staticmethod(refused) if refused else None,
                 "problem": staticmethod(problem) if problem else None})


class DeadlineServer(uvicorn.Server):
    """uvicorn's server on an event loop whose TLS handshakes must end within
    ``handshake_timeout_s`` (the module docstring); plain http runs as uvicorn's."""

    def __init__(self, config: uvicorn.Config, handshake_timeout_s: float) -> None:
        if not handshake_timeout_s > 0:
            raise ValueError(f"handshake_timeout_s={handshake_timeout_s!r}: expected seconds > 0")
        super().__init__(config)
        self.handshake_timeout_s = handshake_timeout_s

    def run(self, sockets=None) -> None:
        timeout_s = self.handshake_timeout_s

        class Loop(_BaseLoop):
            async def create_server(self, *args, **kw):
                if kw.get("ssl") is not None and kw.get("ssl_handshake_timeout") is None:
                    kw["ssl_handshake_timeout"] = timeout_s
                return await super().create_server(*args, **kw)

        with asyncio.Runner(loop_factory=Loop) as runner:
            runner.run(self.serve(sockets=sockets))
