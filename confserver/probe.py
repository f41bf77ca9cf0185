"""Liveness of a built-in server, for whoever keeps it running (`ramen start`).

A probe is a request the server answers only through its committer, after what it has to write
(see server.op_probe): a server whose process is up but whose event loop or committer is dead or
stuck leaves it unanswered. It needs no session and writes nothing, so probing every second costs
the server nothing durable.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from confserver import wire
from confserver.errors import BadRequest, ConfError, Disconnected, error_from_code

log = logging.getLogger(__name__)

#: How long one probe waits for its answer.
PROBE_TIMEOUT_S = 2.0
#: How often a Prober probes.
PROBE_INTERVAL_S = 1.0
_PROBE = wire.encode({"id": 1, "op": "probe"})


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Return once the server at host:port has answered a probe; Disconnected if it does not
    within timeout_s, or any other ConfError it answers with."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(_PROBE)
            (length,) = wire.LENGTH.unpack(_read_exactly(sock, wire.LENGTH.size))
            if length > wire.MAX_FRAME_BYTES:
                raise BadRequest(f"the confserver at {host}:{port} answered a probe with {length} bytes")
            reply = wire.decode(_read_exactly(sock, length))
    except OSError as e:
        raise Disconnected(f"the confserver at {host}:{port} did not answer a probe: {e.strerror or e}") from None
    if "error" in reply:
        raise error_from_code(reply["error"], reply.get("message", ""))


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed")
        data += chunk
    return data


class Prober:
    """Probes a server every interval on a thread of its own, so its keeper never waits on it;
    `last_sign_of_life()` is when it last answered, on time.monotonic's scale (None: never)."""

    def __init__(self, host: str, port: int, *, interval_s: float = PROBE_INTERVAL_S,
                 timeout_s: float = PROBE_TIMEOUT_S):
        self.host, self.port = host, port
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._last_answer: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"probe-{host}:{port}", daemon=True)

    def start(self) -> Prober:
        self._thread.start()
        return self

    def last_sign_of_life(self, pid: int | None = None) -> float | None:
        """`pid` is the keeper's interface (heartbeats check it); only one server holds the port."""
        return self._last_answer

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                probe(self.host, self.port, self.timeout_s)
                self._last_answer = time.monotonic()
            except ConfError as e:
                log.debug("probe: %s", e)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + self.interval_s)
