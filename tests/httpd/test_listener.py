"""httpd holds a bounded number of connections: past the cap a new one is answered 503, naming
the cause, and the ones open, and those opened once some closed, are served."""

import asyncio
import resource

from aiohttp import web

from ramen.httpd import listener
from ramen.httpd.metrics import HttpdStats

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
WAIT_S = 10.0


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def _get(port: int, writer_reader=None) -> tuple[bytes, tuple]:
    """One request on a new connection (kept open) or on `writer_reader`; the head of its answer
    (its body read too) and the connection."""
    reader, writer = writer_reader or await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return head, (reader, writer)


async def _until(condition) -> None:
    """Wait (on the loop) until condition() holds: the server sees a close a moment after it."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def test_past_the_cap_a_connection_is_answered_503_and_the_others_are_served():
    async def scenario():
        app = web.Application()
        app.router.add_get("/", _hello)
        runner = web.AppRunner(app)
        await runner.setup()
        stats = HttpdStats()
        server = await listener.listen(runner, "127.0.0.1", 0, stats, fallback=False, limit=2)
        port = server.sockets[0].getsockname()[1]
        try:
            first, held = await _get(port)
            second, other = await _get(port)
            assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            refused = await asyncio.wait_for(reader.read(), WAIT_S)  # up to the server's close
            assert refused.startswith(b"HTTP/1.1 503 ")
            assert b"httpd holds 2 connections open, the most it takes" in refused
            assert stats.connections_refused == 1
            writer.close()

            again, _ = await _get(port, held)  # the ones open go on
            assert again.startswith(b"HTTP/1.1 200")

            other[1].close()
            await _until(lambda: len(runner.server.connections) < 2)
            later, (_, last) = await _get(port)
            assert later.startswith(b"HTTP/1.1 200")
            assert stats.connections_refused == 1
            for w in (held[1], last):
                w.close()
        finally:
            server.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_the_cap_leaves_most_file_descriptors_to_the_renders(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert listener.max_connections() == 1024 // listener.DESCRIPTOR_SHARE
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert listener.max_connections() == listener.MAX_CONNECTIONS
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert listener.max_connections() == listener.MAX_CONNECTIONS


def test_without_listen_the_port_httpd_had_last_is_taken_again_else_the_default_else_a_free_one():
    """The dashboard's URL changed at every restart of httpd while another instance held the default
    port (37597 -> 46863): open tabs, the printed URL and Grafana's data source broke."""
    import socket

    def held() -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return sock

    async def port_of(port: int, before: int | None) -> int:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        server = await listener.listen(runner, "127.0.0.1", port, HttpdStats(), fallback=True, before=before)
        found = server.sockets[0].getsockname()[1]
        server.close()
        await runner.cleanup()
        return found

    async def scenario():
        default = held()  # another instance's httpd
        default_port = default.getsockname()[1]
        try:
            first = await port_of(default_port, None)  # a free one
            assert first != default_port
            assert await port_of(default_port, first) == first  # restarted: the same
            other = held()
            try:  # the last one taken meanwhile: a free one again
                assert await port_of(default_port, other.getsockname()[1]) not in (default_port,
                                                                                  other.getsockname()[1])
            finally:
                other.close()
        finally:
            default.close()
        assert await port_of(default_port, first) == first  # the default free again: still the last one
        assert await port_of(default_port, None) == default_port

    asyncio.run(scenario())
