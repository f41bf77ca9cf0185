"""httpd's listening socket, with a cap on the connections it holds.

aiohttp keeps every connection it accepts, each with a file descriptor, for as long as its client
keeps it (up to IDLE_CONNECTION_TIMEOUT_S after its last request), and opening one needs no
credentials. A client that opened thousands would take the descriptors httpd's renders need (each
log buffer a render reads holds one). Past the cap, a new connection is answered 503, naming the
cause, and closed; the ones open go on.

The count is aiohttp's (its handlers register as their connection is made), so a burst accepted in
one turn of the loop may pass the cap by up to the listen backlog (100) before the count catches up:
the cap bounds the descriptors, it is not exact.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource

from aiohttp import web

from ramen.httpd.metrics import HttpdStats

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 512
"""Connections held open at most: far beyond what Grafana (a pool per data source) and a few
browsers (six each) open."""
DESCRIPTOR_SHARE = 4
"""Connections take at most 1/DESCRIPTOR_SHARE of the process's file descriptor limit (RLIMIT_NOFILE)."""
REFUSAL_LINGER_S = 1.0
"""How long a refused connection stays open for its client to read the 503 and close: closing it
with the request unread would reset it, and the client would see a reset, not the reason."""


def max_connections() -> int:
    """MAX_CONNECTIONS, or fewer when the process may open few files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // DESCRIPTOR_SHARE))


class _Refusal(asyncio.Protocol):
    """A connection past the cap: the 503 written at once, what the client sends read and dropped,
    closed when the client closes or REFUSAL_LINGER_S later."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._answer)
        transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself


def refusal(limit: int) -> bytes:
    body = f"httpd holds {limit} connections open, the most it takes: try again once some close\n".encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


async def listen(runner: web.AppRunner, host: str, port: int, stats: HttpdStats, *, fallback: bool,
                 limit: int | None = None, before: int | None = None) -> asyncio.Server:
    """Serve `runner`'s app (set up) on host:port, holding at most `limit` connections (default
    max_connections()); when `fallback`, on port `before` first if given (the one this instance's
    httpd had last: its URL stays the same across restarts), and on a free port when those are
    taken. The caller closes the server it returns before cleaning up the runner."""
    server = runner.server
    limit = max_connections() if limit is None else limit
    answer = refusal(limit)

    def protocol() -> asyncio.Protocol:
        if len(server.connections) >= limit:
            stats.add("connections_refused")
            return _Refusal(answer)
        return server()

    loop = asyncio.get_running_loop()
    ports = [port] if not fallback or before in (None, port) else [before, port]
    for tried in ports:
        try:
            return await loop.create_server(protocol, host, tried, reuse_address=True)
        except OSError as e:
            if not (fallback and e.errno == errno.EADDRINUSE):
                raise
            log.info("%s:%d is taken (another ramen?)", host, tried)
    log.info("taking a free port")
    return await loop.create_server(protocol, host, 0)
