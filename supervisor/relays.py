"""Relaying a replay's result through the confserver, for a client that cannot map this site's files.

A request with `relay` names no recipient: the supervisor creates the result log itself, where a
client would have (`paths.recipient_log(channel)`), before the replay is wired; the target writes to
it as to any client's. An agent of the duty cycle, `Relays`, reads it as ramen/replay/client.py's
Replay does (an Image and a FragmentAssembler) and writes the channel's TUPLES messages to
`replay-results/<channel>/<n>` (ramen/replay/contract.py, ResultPart), then, at the target's
END_OF_REPLAY, `replay-results/<channel>/end`. Past `max_bytes` it fails the replay instead (the
confserver is no place for big results) and drops what it wrote.

The log goes when the relay ends, fails or is torn down. The result keys are the client's to
delete once read; those nobody deleted go once the request's timeout has passed (its client gave
up by then), and, after a restart, RELAY_ORPHAN_KEEP_S after the new supervisor found them.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import confserver
from confserver import ConfClient
from ramen import keyspace, paths
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.message import KIND_END_OF_REPLAY, KIND_TUPLES, decode_header
from ramen.replay.client import FRAGMENT_LIMIT, recipient_params
from ramen.replay.contract import (DEFAULT_REPLAY_TIMEOUT_S, RELAY_PART_BYTES, RESULT_MESSAGE_LENGTH, ResultEnd,
                                   ResultPart)
from ramen.transport import CountersFile, FragmentAssembler, Image, LogBuffer
from ramen.tuples import tuple_count
from supervisor import defaults

log = logging.getLogger(__name__)

PART_RAW_BYTES = RELAY_PART_BYTES // 4 * 3
"""Bytes of the result stream per part: base64 makes 4 characters of every 3 bytes."""
RELAY_ORPHAN_KEEP_S = DEFAULT_REPLAY_TIMEOUT_S
"""Result keys a new supervisor finds without a request (their relay's supervisor died) go this
long later: their request's own timeout is unknown, this is the default one."""
_MIB = 1024 * 1024


def max_bytes_from_env(env: Mapping[str, str]) -> int:
    """RELAY_MAX_BYTES, or the RELAY_MAX_BYTES_ENV override (a number of bytes, for tests and sites
    that know their confserver)."""
    text = env.get(defaults.RELAY_MAX_BYTES_ENV)
    if not text:
        return defaults.RELAY_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        log.warning("%s=%r is not a positive number of bytes: using %d", defaults.RELAY_MAX_BYTES_ENV, text,
                    defaults.RELAY_MAX_BYTES)
        return defaults.RELAY_MAX_BYTES
    return value


def format_bytes(count: int) -> str:
    """16 MiB, 300 KiB, 1000 bytes: the bound as a user reads it."""
    for unit, size in (("MiB", _MIB), ("KiB", 1024)):
        if count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


@dataclass
class Relay:
    """One relayed replay: its log, what was read of it and not yet written, what was written."""

    channel: int
    path: Path
    log: LogBuffer
    image: Image
    assembler: FragmentAssembler | None = None
    pending: bytearray = field(default_factory=bytearray)
    """The result stream read and not yet in a part."""
    pending_rows: int = 0
    """Rows of the messages that begin in `pending`."""
    parts: int = 0
    rows: int = 0
    written_bytes: int = 0
    """base64 characters written so far, what max_bytes bounds."""
    ended: bool = False
    """The target's END_OF_REPLAY was read (the end key is written)."""
    failed: bool = False
    closed: bool = False


class Relays:
    """The relays of one supervisor: open() before a relayed replay is wired, do_work() each duty
    cycle, finish() when its request goes. `fail(channel, message)` sets the request's error."""

    def __init__(self, client: ConfClient, site: str, *, fail: Callable[[int, str], None],
                 max_bytes: int = defaults.RELAY_MAX_BYTES, poll_bytes: int = defaults.RELAY_POLL_BYTES,
                 clock: Clock = SYSTEM_CLOCK):
        self.client = client
        self.site = site
        self.fail = fail
        self.max_bytes = max_bytes
        self.poll_bytes = poll_bytes
        self.clock = clock
        self.relays: dict[int, Relay] = {}
        self.leftovers: dict[int, int] = {}
        """Channel -> epoch µs after which its result keys are deleted, if nobody did."""
        self._counters: CountersFile | None = None

    def open(self, channel: int) -> str:
        """Create the result log of a relayed replay and subscribe to it; its path, the recipient
        to wire the target to. A log left there (a supervisor that died) is replaced."""
        if channel in self.relays:
            return str(self.relays[channel].path)
        path = paths.recipient_log(channel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        if self._counters is None:
            self._counters = CountersFile.open(paths.counters_path())
        log_buffer = LogBuffer.create(path, recipient_params(channel))
        relay = Relay(channel, path, log_buffer, Image(log_buffer, self._counters, name=f"replay {channel} relay"))
        relay.assembler = FragmentAssembler(lambda message, *_: self._on_message(relay, message), hand_over=True)
        self.relays[channel] = relay
        self.leftovers.pop(channel, None)
        log.info("replay %d: relaying its result through the confserver", channel)
        return str(path)

    def found(self, channels: set[int]) -> None:
        """At start, once every request is known: result keys of no request are leftovers."""
        now_us = self.clock.epoch_us()
        for name in self.client.children(keyspace.REPLAY_RESULTS):
            if name.isdigit() and int(name) not in channels and int(name) not in self.relays:
                self.leftovers.setdefault(int(name), now_us + round(RELAY_ORPHAN_KEEP_S * 1e6))

    # -- duty cycle ----------------------------------------------------------------------------

    def do_work(self, now: float) -> int:
        work = 0
        for relay in list(self.relays.values()):
            if not relay.closed:
                work += self._pump(relay)
        now_us = self.clock.epoch_us()
        for channel, after_us in list(self.leftovers.items()):
            if now_us >= after_us:
                del self.leftovers[channel]
                self._delete_results(channel)
                log.info("replay %d: result keys nobody read deleted", channel)
                work += 1
        return work

    def _pump(self, relay: Relay, budget: int | None = None) -> int:
        """Read what the log holds (up to `budget` bytes, default poll_bytes; None-like: all) and
        write it on; the end key at END_OF_REPLAY."""
        budget = self.poll_bytes if budget is None else budget
        start, fragments = relay.image.position, 0
        while not relay.ended and (read := relay.image.position - start) < budget:
            # fragments of up to a payload each: this poll stays within the budget (one at least)
            limit = max(1, min(FRAGMENT_LIMIT, (budget - read) // relay.log.max_payload_length))
            polled = relay.image.poll(relay.assembler.on_fragment, limit)
            fragments += polled
            if polled == 0:
                break
            if len(relay.pending) >= PART_RAW_BYTES:
                self._write_parts(relay, whole_only=True)
                if relay.closed:
                    return 1
        # Whatever was read goes out now, a part short or not: the client streams it.
        if relay.pending:
            self._write_parts(relay, whole_only=False)
        if relay.ended and not relay.closed:
            self.client.set(keyspace.replay_result_end_key(relay.channel),
                            ResultEnd(relay.parts, relay.rows).to_value())
            log.info("replay %d: result relayed: %d rows in %d parts, %d bytes", relay.channel, relay.rows,
                     relay.parts, relay.written_bytes)
            self._close(relay)
        return 1 if fragments else 0

    def _on_message(self, relay: Relay, message) -> None:
        header = decode_header(message)
        if header is None or header.channel != relay.channel:
            return
        if header.kind == KIND_TUPLES:
            rows = tuple_count(message) or 0
            relay.pending += RESULT_MESSAGE_LENGTH.pack(len(message))
            relay.pending += message
            relay.pending_rows += rows
            relay.rows += rows
        elif header.kind == KIND_END_OF_REPLAY:
            relay.ended = True

    def _write_parts(self, relay: Relay, *, whole_only: bool) -> None:
        """`pending` in parts of PART_RAW_BYTES (the last one shorter unless `whole_only`), each
        checked against the bound first."""
        while relay.pending and (len(relay.pending) >= PART_RAW_BYTES or not whole_only):
            chunk = bytes(relay.pending[:PART_RAW_BYTES])
            data = base64.b64encode(chunk).decode("ascii")
            if relay.written_bytes + len(data) > self.max_bytes:
                self._too_big(relay)
                return
            self.client.set(keyspace.replay_result_part_key(relay.channel, relay.parts),
                            ResultPart(relay.pending_rows, data).to_value())
            del relay.pending[:len(chunk)]
            relay.pending_rows = 0  # the rows of a message count in the part it begins in
            relay.parts += 1
            relay.written_bytes += len(data)

    def _too_big(self, relay: Relay) -> None:
        """Stop, drop the parts written, and fail the replay: in its request, and in the end key
        too (the request may be gone already: its target ended the replay before we read it all)."""
        relay.failed = True
        self._close(relay)
        self._delete_results(relay.channel)
        message = (f"the result of replay {relay.channel} is over {format_bytes(self.max_bytes)}, too big for "
                   f"the confserver: replay from a host of site {self.site} (without --via-confserver), "
                   f"or a shorter range")
        self.client.set(keyspace.replay_result_end_key(relay.channel),
                        ResultEnd(relay.parts, relay.rows, error=message).to_value())
        log.warning("replay %d: %s", relay.channel, message)
        self.fail(relay.channel, message)

    # -- the end -------------------------------------------------------------------------------

    def finish(self, channel: int, created_us: int, timeout_s: float) -> None:
        """The request went (the target deletes it after its END_OF_REPLAY; or it was withdrawn,
        timed out): relay what is left, or say in the end key that no end will come; the result
        keys go after the request's timeout if the client did not delete them."""
        relay = self.relays.pop(channel, None)
        if relay is None:
            return
        if not relay.closed and relay.parts and self._abandoned(relay):
            self._close(relay)
            self._delete_results(channel)
            log.info("replay %d: its client went before the end of the result", channel)
            return
        if not relay.closed:
            self._pump(relay, budget=1 << 62)
        if not relay.ended and not relay.failed:
            self._close(relay)
            self.client.set(keyspace.replay_result_end_key(channel),
                            ResultEnd(relay.parts, relay.rows,
                                      error=f"replay {channel} was torn down before it finished").to_value())
        self.leftovers[channel] = created_us + round((timeout_s + defaults.RELAY_KEEP_GRACE_S) * 1e6)

    def _abandoned(self, relay: Relay) -> bool:
        """Whether the client deleted the result before its end (`--limit`, `| head`): relaying
        the rest of the log (up to a term window of the target's) would be for nobody."""
        try:
            return self.client.get_or_none(keyspace.replay_result_part_key(relay.channel, 0)) is None
        except confserver.ConfError:
            return False

    def _close(self, relay: Relay) -> None:
        """Stop reading the log and remove it (a target still writing to it writes to a file gone)."""
        if relay.closed:
            return
        relay.closed = True
        relay.image.close()
        relay.log.close()
        relay.path.unlink(missing_ok=True)
        relay.pending.clear()

    def _delete_results(self, channel: int) -> None:
        try:
            self.client.delete_tree(keyspace.replay_results_key(channel))
        except confserver.ConfError as e:
            log.error("replay %d: cannot delete its result keys: %s", channel, e)

    def close(self) -> None:
        """The supervisor stops: every relay's log goes (their replays fail: see stop_all)."""
        for relay in self.relays.values():
            self._close(relay)
        self.relays.clear()
        if self._counters is not None:
            self._counters.close()
            self._counters = None


__all__ = ["Relay", "Relays", "format_bytes", "max_bytes_from_env"]
