"""The sender agent: network publications behind real UDP sockets (Aeron's Sender).

`SenderAgent.add_publication(log_path, channel)` opens a publication's log buffer (written by an
ExclusivePublication in another process or thread) and sends it to the channel's endpoint with a
NetworkSender (sender.py, the rules of what goes on the wire and when). The agent only moves bytes
and keeps the books:

- One non-blocking socket per (endpoint, control) pair, connected to the endpoint (sockets.py),
  shared by the publications sent there; the control frames read from it (SM, NAK, RTTM) go to the
  publication of their (session, stream), anything else is counted as garbage and dropped.
- Flow control the ramen way: once the first SM came, the agent takes part in the publication's
  flow control as a subscriber of its log would, with a subscriber position (sub-pos) counter at
  snd-pos, heartbeated every duty cycle. The publication's limit, the slowest subscriber + half a
  term (flow_control.py), is then Aeron's pub-lmt = snd-pos + term window: NOT_CONNECTED before the
  first SM, BACK_PRESSURED past snd-pos + half a term after; and the publication cleans two terms
  behind snd-pos, so a retransmission (at most a term back) always finds its bytes. With no SM for
  the connection timeout (5 s) the position is withdrawn: the publication sees NOT_CONNECTED.
- Beyond Aeron, a publication added with a tether hold has a tethered position, as a recorder's: a
  receiver silent for the connection timeout (its process restarting) leaves the position where it
  is, no longer heartbeated, and the writer waits for it for the hold instead of going on without
  it. So does a sender's process killed (the next agent's position of the log takes the dead one's
  over), and a publication removed with keep_position, until the publication that succeeds it has
  its own position (add_publication's `succeeding`). A live stream whose receiving side restarts
  loses nothing; a receiver gone for good holds the writer for the hold, then no longer.
- A datagram the kernel will not take now (EAGAIN) waits in the socket's queue and goes first next
  duty cycle, before anything new of that socket: nothing is lost. An ICMP port unreachable
  (ECONNREFUSED) is counted; what it refused counts as lost on the network, which NAKs and SETUP
  retries repair.
- Linger: once the publication closed (its log's end-of-stream position) and everything was sent,
  the sender sends EOS heartbeats until an SM with the EOS flag, or for PUBLICATION_LINGER_NS; then
  the publication is removed, its log closed and its counters freed.

Counters (agent_counters.py), per publication, labelled `<name>: <session> <stream> <log> ->
<endpoint>`: snd-pos, snd-lmt, snd-bpe, naks-received, retransmits, short-sends, heartbeats-sent,
setups-sent, sms-received, skipped-bytes; per socket, labelled with its endpoint: unreachable and
garbage by kind.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import counters as ctr
from ramen.transport.counters import Counter, CountersFile
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.udp import protocol, sockets
from ramen.transport.udp.agent_counters import CounterGroup, stream_key
from ramen.transport.udp.channel import Address, ChannelError, UdpChannel
from ramen.transport.udp.datagram_io import MAX_GSO_SEGMENTS
from ramen.transport.udp.defaults import (AGENT_RETRANSMIT_LINGER_NS, PUBLICATION_CONNECTION_TIMEOUT_NS,
                                          PUBLICATION_LINGER_NS, SENDER_MAX_CONTROL_DATAGRAMS_PER_WORK)
from ramen.transport.udp.protocol import NakFrame, RttMeasurement, StatusMessage, WireError, frames_of
from ramen.transport.udp.sender import NetworkSender
from ramen.transport.udp.setup_key import SetupKey

log = logging.getLogger(__name__)

_NANOS_PER_MILLI = 1_000_000

PUBLICATION_COUNTERS = ("snd-pos", "snd-lmt", "snd-bpe", "naks-received", "retransmits", "short-sends",
                        "heartbeats-sent", "setups-sent", "sms-received", "skipped-bytes")

# Kinds of garbage a sender's socket gets (the receiver's are receiver.GARBAGE_*).
GARBAGE_SHORT = "short"
"""Fewer bytes than a frame header."""
GARBAGE_VERSION = "version"
GARBAGE_UNKNOWN_TYPE = "unknown-type"
GARBAGE_MALFORMED = "malformed"
"""A known frame type with a length or layout that does not fit."""
GARBAGE_UNKNOWN_SESSION = "unknown-session"
"""A control frame of a (session, stream) this socket does not send."""
GARBAGE_NOT_FOR_SENDER = "not-for-sender"
"""A frame a receiver takes (DATA, PAD, SETUP) sent to a sender."""

_KNOWN_TYPES = frozenset(protocol.TYPE_NAMES)


def garbage_kind(datagram) -> str:
    """Why a datagram that is not frames was refused, by its first frame's header."""
    if len(datagram) < protocol.COMMON_LENGTH:
        return GARBAGE_SHORT
    _, version, _, frame_type = protocol.COMMON.unpack_from(datagram, 0)
    if version != protocol.CURRENT_VERSION:
        return GARBAGE_VERSION
    return GARBAGE_MALFORMED if frame_type in _KNOWN_TYPES else GARBAGE_UNKNOWN_TYPE


@dataclass(eq=False)
class NetworkPublication:
    """One publication an agent sends: what add_publication returns, and remove_publication takes."""
    log: LogBuffer
    channel: UdpChannel
    sender: NetworkSender
    counters: CounterGroup
    endpoint: "_SendEndpoint"
    tether_hold_ms: int | None = None
    """Its position's tether hold (add_publication); None: untethered."""
    succeeding: "NetworkPublication | None" = None
    """A removed publication of the same log whose position holds the writer until ours does."""
    subscriber_position: Counter | None = None
    """The sub-pos counter at snd-pos by which the publication's writer is flow-controlled (None
    before the first SM, after a connection timeout if untethered, or without a counters file)."""
    silent: bool = False
    """No SM for the connection timeout: a tethered position is no longer heartbeated."""
    last_sm_ns: int | None = None
    linger_since_ns: int | None = None
    """When the publication was found closed and all of it sent (None before)."""
    eos_sm_received: bool = False
    is_closed: bool = False
    skips_seen: int = 0
    """The sender's skips already told of (NetworkSender._skip_if_overtaken)."""

    @property
    def session_id(self) -> int:
        return self.sender.session_id

    @property
    def stream_id(self) -> int:
        return self.sender.stream_id

    @property
    def log_path(self) -> Path:
        return self.log.path


@dataclass(eq=False)
class _SendEndpoint:
    """One socket and the publications sent through it."""
    endpoint: Address
    control: Address | None
    sock: socket.socket
    counters: CounterGroup
    publications: dict[tuple[int, int], NetworkPublication] = field(default_factory=dict)
    pending: deque = field(default_factory=deque)
    """(datagram, None: the connected peer, the publication's counters) the kernel refused with
    EAGAIN, in order: sent first next cycle (sockets.send_queued)."""


class SenderAgent:
    """Sends network publications (Aeron's Sender); a duty-cycle agent (STYLE.md, section 3)."""

    def __init__(self, counters: CountersFile | None, *, clock: Clock = SYSTEM_CLOCK,
                 setup_key: SetupKey | None = None) -> None:
        """`counters`: where the agent's counters and its flow-control positions go; without one,
        nothing holds the publications' writers back but their other subscribers. `setup_key`:
        every SETUP it sends is signed with it (setup_key.py)."""
        self.counters = counters
        self.setup_key = setup_key
        self._clock = clock
        self._endpoints: dict[tuple[Address, Address | None], _SendEndpoint] = {}
        self._buffer = bytearray(sockets.DATAGRAM_MAX_BYTES)
        self._view = memoryview(self._buffer)
        self._kept: list[NetworkPublication] = []
        """Publications removed with keep_position whose position still holds their writer."""

    # -- publications ---------------------------------------------------------------------------

    def add_publication(self, log_path: str | os.PathLike, channel: UdpChannel, *,
                        term_window_length: int | None = None, tether_hold_ms: int | None = None,
                        succeeding: NetworkPublication | None = None) -> NetworkPublication:
        """Send the publication whose log is at `log_path` to `channel.endpoint`, from where its
        tail is now. `tether_hold_ms`: the sender's position is tethered, with this hold (0: the
        transport's default; None: untethered). `succeeding`: a publication of the same log removed
        with keep_position, whose position holds the writer until this one's first SM. ChannelError
        for a channel without an endpoint, one that contradicts the log or names a stream sent there
        already; LogBufferError for a log that cannot be opened; SocketError (also an OSError) for
        a socket that cannot be opened."""
        if channel.endpoint is None:
            raise ChannelError(f"channel {channel}: a publication needs endpoint=")
        log_buffer = LogBuffer.open(log_path, writable=False)
        try:
            for name, wanted, actual in (("mtu", channel.mtu, log_buffer.mtu_length),
                                         ("term-length", channel.term_length, log_buffer.term_length),
                                         ("session-id", channel.session_id, log_buffer.session_id)):
                if wanted is not None and wanted != actual:
                    raise ChannelError(f"channel {channel}: {name}={wanted}, but log {log_buffer.path} has {actual}")
            key = (channel.endpoint, channel.control)
            endpoint = self._endpoints.get(key)
            stream = (log_buffer.session_id, log_buffer.stream_id)
            if endpoint is not None and stream in endpoint.publications:
                raise ChannelError(f"channel {channel}: session {stream[0]} stream {stream[1]} is sent there already")
            if endpoint is None:
                endpoint = self._open_endpoint(channel.endpoint, channel.control)
            # Views of the log, sent in this duty cycle (GSO: up to 64 a system call); what the socket
            # will not take now is copied into the endpoint's queue (_send).
            sender = NetworkSender(log_buffer, clock=self._clock, term_window_length=term_window_length,
                                   views=True, max_datagrams_per_work=MAX_GSO_SEGMENTS,
                                   retransmit_linger_ns=AGENT_RETRANSMIT_LINGER_NS, setup_key=self.setup_key)
            suffix = f"{stream[0]} {stream[1]} {log_buffer.path.name} -> {channel.endpoint}"
            group = CounterGroup(self.counters, PUBLICATION_COUNTERS, suffix,
                                 key=stream_key(log_buffer.correlation_id, *stream),
                                 registration_id=log_buffer.correlation_id)
        except BaseException:
            log_buffer.close()
            raise
        publication = NetworkPublication(log_buffer, channel, sender, group, endpoint, tether_hold_ms,
                                         succeeding if succeeding in self._kept else None)
        endpoint.publications[stream] = publication
        self._update_counters(publication)
        log.info("sending session %d stream %d of %s to %s from %s", stream[0], stream[1], log_buffer.path,
                 channel.endpoint, sockets.local_address(endpoint.sock))
        return publication

    def remove_publication(self, publication: NetworkPublication, *,
                           keep_position: bool = False) -> NetworkPublication | None:
        """Stop sending at once (no linger, no EOS): free its counters, close its log, and its
        socket if no other publication uses it. `keep_position`: a tethered position stays, no
        longer heartbeated, holding the writer for its hold or until a publication that succeeds
        this one has its own; returns what to pass as add_publication's `succeeding` then (this
        publication, or the one it succeeded if it had no position yet; None: nothing kept)."""
        if publication.is_closed:
            return None
        publication.is_closed = True
        endpoint = publication.endpoint
        endpoint.publications.pop((publication.session_id, publication.stream_id), None)
        if endpoint.pending:
            endpoint.pending = deque(item for item in endpoint.pending if item[2] is not publication.counters)
        kept = None
        if keep_position and publication.tether_hold_ms is not None:
            if publication.subscriber_position is not None:
                kept = publication
                self._kept.append(publication)
            else:
                kept, publication.succeeding = publication.succeeding, None
        self._release_succeeded(publication)
        if kept is not publication:
            self._withdraw_position(publication)
        publication.counters.close()
        publication.log.close()
        if not endpoint.publications:
            self._close_endpoint(endpoint)
        return kept

    @staticmethod
    def is_done(publication: NetworkPublication) -> bool:
        """Whether the publication is no longer sent: its linger ended (or it was removed)."""
        return publication.is_closed

    @property
    def publications(self) -> list[NetworkPublication]:
        return [p for endpoint in self._endpoints.values() for p in endpoint.publications.values()]

    def local_address(self, publication: NetworkPublication) -> Address:
        """Where the publication's datagrams come from (its socket's address)."""
        return sockets.local_address(publication.endpoint.sock)

    def close(self) -> None:
        """Stop every publication at once (no EOS, no linger), their positions freed."""
        for publication in self.publications:
            self.remove_publication(publication)
        for kept in self._kept:
            self._withdraw_position(kept)
        self._kept.clear()

    # -- the duty cycle -------------------------------------------------------------------------

    def do_work(self) -> int:
        """Read control frames, send what is due; returns the datagrams read and sent."""
        now = self._clock.nanos()
        work = 0
        for endpoint in list(self._endpoints.values()):
            work += self._read_control(endpoint, now)
            if endpoint.pending:
                work += sockets.send_queued(endpoint.sock, endpoint.pending, endpoint.counters)
            for publication in list(endpoint.publications.values()):
                if not endpoint.pending:
                    work += self._send(endpoint, publication, publication.sender.do_work(now))
                self._housekeeping(publication, now)
        if self._kept:
            self._forget_dropped_kept()
        return work

    def _send(self, endpoint: _SendEndpoint, publication: NetworkPublication, datagrams: list) -> int:
        """Send this duty cycle's datagrams (views of the log: they must not outlive it, so what
        the socket will not take now is queued as copies)."""
        if not datagrams:
            return 0
        done, lost = sockets.send_many(endpoint.sock, datagrams)
        if lost:
            endpoint.counters["unreachable"].add(lost)
        if done < len(datagrams):
            publication.counters["short-sends"].add(1)
            endpoint.pending.extend((bytes(later), None, publication.counters) for later in datagrams[done:])
        return done

    def _read_control(self, endpoint: _SendEndpoint, now: int) -> int:
        buffer, view = self._buffer, self._view
        read = 0
        while read < SENDER_MAX_CONTROL_DATAGRAMS_PER_WORK:
            length, address = sockets.receive(endpoint.sock, buffer)
            if address is None:
                if length == sockets.UNREACHABLE:
                    endpoint.counters["unreachable"].add(1)
                    read += 1
                    continue
                break
            read += 1
            datagram = view[:length]
            try:
                frames = frames_of(datagram)
            except WireError:
                self._garbage(endpoint, garbage_kind(datagram))
                continue
            for item in frames:
                if isinstance(item, (StatusMessage, NakFrame, RttMeasurement)):
                    publication = endpoint.publications.get((item.session_id, item.stream_id))
                    if publication is None:
                        self._garbage(endpoint, GARBAGE_UNKNOWN_SESSION)
                    elif isinstance(item, StatusMessage):
                        self._on_status(publication, item, now)
                    elif isinstance(item, NakFrame):
                        publication.sender.on_nak(item)
                    else:
                        publication.sender.on_rttm(item)
                else:
                    self._garbage(endpoint, GARBAGE_NOT_FOR_SENDER)
        return read

    def _garbage(self, endpoint: _SendEndpoint, kind: str) -> None:
        endpoint.counters.add_counter(f"garbage {kind}").add(1)

    def _on_status(self, publication: NetworkPublication, sm: StatusMessage, now: int) -> None:
        sender = publication.sender
        connected = sender.is_connected
        sender.on_status(sm)
        if not connected and sender.resumed_from is not None:
            log.info("%s: its receiver at %s has the stream up to %d: sent on from there", publication.log.path.name,
                     publication.channel.endpoint, sender.resumed_from)
        publication.last_sm_ns = now
        if sm.is_eos:
            publication.eos_sm_received = True
        if publication.subscriber_position is None and publication.sender.is_connected and self.counters is not None:
            self._register_position(publication, now)

    # -- flow control: the sender as a subscriber of the publication's log ----------------------

    def _register_position(self, publication: NetworkPublication, now: int) -> None:
        """Our position in the writer's flow control, which from now on takes over from those the
        publication succeeds: the one it was given (add_publication's `succeeding`), and those
        that senders in processes now dead left on its log."""
        log_buffer = publication.log
        sender = publication.sender
        counters = self.counters
        counter = counters.allocate(
            ctr.SUBSCRIBER_POSITION_TYPE_ID,
            f"sub-pos: {sender.session_id} {sender.stream_id} {log_buffer.path.name} -> {publication.channel.endpoint}",
            key=ctr.subscriber_key(log_buffer.correlation_id, sender.session_id, sender.stream_id,
                                   tether_hold_ms=publication.tether_hold_ms, network_sender=True),
            registration_id=log_buffer.correlation_id, heartbeat_ms=now // _NANOS_PER_MILLI)
        counter.set(sender.sender_position)
        publication.subscriber_position = counter
        publication.silent = False
        self._release_succeeded(publication)
        counters.free_orphans(ctr.SUBSCRIBER_POSITION_TYPE_ID, log_buffer.correlation_id,
                              keep=lambda counter_id: not ctr.is_network_sender(counters.key(counter_id)))

    def _release_succeeded(self, publication: NetworkPublication) -> None:
        """Free the kept position of the publication this one succeeds."""
        if publication.succeeding is not None:
            if publication.succeeding in self._kept:
                self._kept.remove(publication.succeeding)
                self._withdraw_position(publication.succeeding)
            publication.succeeding = None

    def _forget_dropped_kept(self) -> None:
        """Free the kept positions their writers gave up on (silent past their hold)."""
        for kept in [p for p in self._kept if p.subscriber_position.status == ctr.COUNTER_DROPPED]:
            log.warning("%s: no sender took over the position %d kept for it within its hold; its writer goes "
                        "on without it", kept.log_path.name, kept.subscriber_position.get())
            self._kept.remove(kept)
            self._withdraw_position(kept)

    @staticmethod
    def _withdraw_position(publication: NetworkPublication) -> None:
        if publication.subscriber_position is not None:
            publication.subscriber_position.close()
            publication.subscriber_position = None

    def _housekeeping(self, publication: NetworkPublication, now: int) -> None:
        """Counters, the flow-control position and its heartbeat, connection timeout, linger."""
        self._update_counters(publication)
        sender = publication.sender
        if sender.skips != publication.skips_seen:
            publication.skips_seen = sender.skips
            # A warning once a receiver had it: rows it will not get. Before, nobody missed them.
            (log.warning if publication.last_sm_ns is not None else log.debug)(
                "%s: its writer ran more than a term past what was sent (no receiver at %s held it): sent on "
                "from its tail, %d; %d bytes skipped in all", publication.log.path.name,
                publication.channel.endpoint, sender.sender_position, sender.skipped_bytes)
        position = publication.subscriber_position
        if position is not None and position.status == ctr.COUNTER_DROPPED:
            # The publication dropped us (this agent did not run for its subscriber liveness
            # timeout, or a tethered position was silent for its hold): a dropped position holds
            # nobody back, so take a fresh one below once an SM comes.
            log.warning("%s: the publication dropped the sender's position %d; registering again with the next SM",
                        publication.log.path.name, position.get())
            self._withdraw_position(publication)
            position = None
        if position is not None:
            if now - publication.last_sm_ns <= PUBLICATION_CONNECTION_TIMEOUT_NS:
                position.set(publication.sender.sender_position)
                position.heartbeat(now // _NANOS_PER_MILLI)
                publication.silent = False
            elif publication.tether_hold_ms is None:
                log.warning("%s: no SM from %s for %.1f s: not connected", publication.log.path.name,
                            publication.channel.endpoint, PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9)
                self._withdraw_position(publication)
            elif not publication.silent:
                log.warning("%s: no SM from %s for %.1f s: its writer waits for it for its tether hold",
                            publication.log.path.name, publication.channel.endpoint,
                            PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9)
                publication.silent = True
        elif self.counters is not None and publication.sender.is_connected and publication.last_sm_ns is not None \
                and now - publication.last_sm_ns <= PUBLICATION_CONNECTION_TIMEOUT_NS:
            self._register_position(publication, now)
        if publication.linger_since_ns is None:
            if publication.sender.is_end_of_stream:
                publication.linger_since_ns = now
        elif publication.eos_sm_received or now - publication.linger_since_ns > PUBLICATION_LINGER_NS:
            log.info("%s: end of stream at %d sent to %s%s; removed", publication.log.path.name,
                     publication.sender.sender_position, publication.channel.endpoint,
                     ", its receiver said EOS" if publication.eos_sm_received else " (linger over)")
            self.remove_publication(publication)

    @staticmethod
    def _update_counters(publication: NetworkPublication) -> None:
        sender, group = publication.sender, publication.counters
        group["snd-pos"].set(sender.sender_position)
        group["snd-lmt"].set(sender.sender_limit)
        group["snd-bpe"].set(sender.back_pressure_events)
        group["naks-received"].set(sender.naks_received)
        group["retransmits"].set(sender.retransmits)
        group["heartbeats-sent"].set(sender.heartbeats_sent)
        group["setups-sent"].set(sender.setups_sent)
        group["sms-received"].set(sender.status_messages_received)
        group["skipped-bytes"].set(sender.skipped_bytes)

    # -- sockets --------------------------------------------------------------------------------

    def _open_endpoint(self, endpoint: Address, control: Address | None) -> _SendEndpoint:
        sock = sockets.open_send_socket(endpoint, control)
        try:
            group = CounterGroup(self.counters, ("unreachable",), f"sender {sockets.local_address(sock)} -> {endpoint}")
        except BaseException:
            sock.close()
            raise
        opened = _SendEndpoint(endpoint, control, sock, group)
        self._endpoints[(endpoint, control)] = opened
        return opened

    def _close_endpoint(self, endpoint: _SendEndpoint) -> None:
        self._endpoints.pop((endpoint.endpoint, endpoint.control), None)
        endpoint.counters.close()
        endpoint.sock.close()

    def endpoint_counters(self, publication: NetworkPublication) -> CounterGroup:
        """The counters of the publication's socket (unreachable, garbage by kind)."""
        return publication.endpoint.counters


__all__ = ["SenderAgent", "NetworkPublication", "PUBLICATION_COUNTERS", "garbage_kind"]
