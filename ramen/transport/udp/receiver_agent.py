"""The receiver agent: network images behind real UDP sockets (Aeron's Receiver).

`ReceiverAgent.add_subscription(channel, stream_id)` binds a non-blocking socket to the channel's
endpoint (one socket per endpoint, shared by its streams) with a NetworkReceiver behind it
(receiver.py: the rules of images, SMs and NAKs). The agent only moves bytes and keeps the books:

- Each duty cycle reads a bounded batch of datagrams into one reused buffer and hands them to the
  endpoint's NetworkReceiver; its replies (SMs, NAKs) go back to the address each session's
  datagrams come from (a sender's socket, or a proxy in between).
- Images are log buffers under `directory/<host>_<port>/`, read by ordinary local readers (ramen's
  Image, in any process) whose positions, reported in the counters file as for any log, are the
  image's consumption position: the agent reads them as a publication reads its subscribers'
  (flow_control.FlowControl, without its cleaning: the rebuilder cleans), so a slow reader holds
  the sender back through the SMs, and a reader silent for the subscriber liveness timeout is
  dropped as any log's would be. Without a counters file the owner tells the consumption
  (consumed_to).
- The owner learns of images by callbacks (on_image, on_image_ended) or images(): an ImageInfo each,
  with the log's path, session, stream, join position, endpoint and sender's address.
- An image ends when its sender goes silent for the liveness timeout (10 s), or its stream's
  subscription is removed; its log then gets its end-of-stream position (the EOS the sender sent,
  or the rebuilt position), so its readers end cleanly. The log is closed and its file removed
  once no live reader is left on it, or IMAGE_READER_GRACE_NS after it ended at the latest.
- A receiver whose process died leaves its images' logs unended, their readers waiting on them. The
  next receiver of the endpoint goes on in such a log at its image_log (_log_to_resume) when its
  sender sets the stream up again: the readers lose nothing the sender's log still holds.
- A datagram the kernel will not take now (EAGAIN) is sent first next duty cycle; an ICMP error is
  counted. Neither raises out of do_work.
- What strangers can cost it is bounded: with `allow`, datagrams from other addresses are counted
  (`garbage not-allowed`) and dropped undecoded; with `setup_key`, SETUPs not signed with it make
  nothing (setup_key.py); the receiver bounds images per stream and per source address
  (NetworkReceiver); and an image whose counters the counters file refuses (this
  process's share used up) goes on with counters in memory (CounterGroup), never an exception.

Counters (agent_counters.py), per image, labelled `<name>: <session> <stream> <endpoint> <- <sender>
<log>`: rcv-pos, rcv-hwm, naks-sent, loss-gaps, sms-sent, frames-duplicate, frames-over-run; per
socket, labelled `receiver <endpoint>`: images, images-ended, images-resumed, images-overtaken,
images-rejoined, setups-received, setups-refused, images-evicted, frames-unsubscribed, short-sends,
unreachable, and `garbage <kind>`
for each kind seen (receiver.GARBAGE_*).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
from collections import Counter as Tally
from collections import deque
from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network, ip_address
from pathlib import Path
from typing import Callable, Sequence

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport.counters import CountersFile, InMemoryCounter
from ramen.transport.defaults import SUBSCRIBER_LIVENESS_TIMEOUT_S
from ramen.transport.errors import TransportError
from ramen.transport.flow_control import FlowControl
from ramen.transport.logbuffer import END_OF_STREAM_UNSET, LogBuffer
from ramen.transport.udp import sockets
from ramen.transport.udp.agent_counters import CounterGroup, stream_key
from ramen.transport.udp.channel import Address, ChannelError, UdpChannel
from ramen.transport.udp.defaults import (AGENT_NAK_RETRY_NS, AGENT_STALLED_SM_NS, IMAGE_READER_GRACE_NS,
                                          RECEIVER_MAX_DATAGRAMS_PER_WORK, UNREAD_IMAGE_HOLD_NS)
from ramen.transport.udp.protocol import SetupFrame
from ramen.transport.udp.receiver import GARBAGE_NOT_ALLOWED, NetworkReceiver, ReceiverImage
from ramen.transport.udp.setup_key import SetupKey

log = logging.getLogger(__name__)

IMAGE_COUNTERS = ("rcv-pos", "rcv-hwm", "naks-sent", "loss-gaps", "sms-sent", "frames-duplicate", "frames-over-run")
ENDPOINT_COUNTERS = ("images", "images-ended", "images-resumed", "images-overtaken", "images-rejoined",
                     "setups-received", "setups-refused", "images-evicted", "frames-unsubscribed", "short-sends",
                     "unreachable")
_ALLOWED_CACHE_MAX = 4096
"""Source addresses whose verdict (allowed or not) is kept, at most: forgotten all at once past it."""

_DATA_SESSION_STREAM_OFFSET = 12
"""sessionId and streamId of a DATA, PAD or SETUP frame (@12, @16): whose datagram it is."""
_CONTROL_SESSION_STREAM_OFFSET = 8
"""sessionId and streamId of an SM or NAK (@8, @12): whose reply it is."""
_SESSION_STREAM = struct.Struct("<ii")
_PENDING_REPLIES_MAX = 1024
"""Replies waiting for a socket that says EAGAIN, at most: past it the oldest go (SMs and NAKs are
sent again by the protocol's own timers), so a socket refusing for long does not grow memory."""


@dataclass(frozen=True)
class ImageInfo:
    """What the owner of a ReceiverAgent learns of an image, for its readers."""
    session_id: int
    stream_id: int
    log_path: Path
    join_position: int
    """Where a reader of the log starts (Image(log, join_position=...))."""
    endpoint: Address
    """The subscription's endpoint the image came to."""
    source: Address
    """The sender's address (its socket, or whatever forwarded its datagrams)."""


class _NoCleaning:
    """The rebuilder cleans an image's log (rebuild.py); FlowControl's cleaner must not."""

    @staticmethod
    def clean_to(position: int) -> None:
        pass


@dataclass(eq=False)
class _AgentImage:
    image: ReceiverImage
    info: ImageInfo
    counters: CounterGroup
    readers: FlowControl | None
    inode: int
    """The log file's, so that an ended image never removes a newer image's file at its path."""
    ended_ns: int | None = None
    tail_position: int = -1
    """The rebuilt position last published as the log's tail (_publish_tail)."""
    unread_since_ns: int | None = None
    """Since when the image has had no live reader (None: it has one)."""
    held_for: int = 0
    """Readers the image waits for before its consumption moves (add_subscription's hold_for_readers):
    0 once they all came."""


@dataclass(eq=False)
class _ReceiveEndpoint:
    address: Address
    sock: socket.socket
    receiver: NetworkReceiver
    counters: CounterGroup
    streams: Tally = field(default_factory=Tally)
    """Subscriptions by stream id (one stream may be subscribed more than once)."""
    images: dict[tuple[int, int], _AgentImage] = field(default_factory=dict)
    sources: dict[tuple[int, int], tuple] = field(default_factory=dict)
    """(session, stream) -> the address its datagrams last came from: where replies go."""
    pending: deque = field(default_factory=lambda: deque(maxlen=_PENDING_REPLIES_MAX))
    """(datagram, address, this endpoint's counters) the kernel refused with EAGAIN: sent first
    next cycle (sockets.send_queued)."""
    image_logs: dict[int, Path] = field(default_factory=dict)
    """stream id -> where its images go (add_subscription's image_log)."""
    holds: dict[int, int] = field(default_factory=dict)
    """stream id -> the readers its images wait for (add_subscription's hold_for_readers)."""
    kept: bool = False
    """Opened by bind(): stays open without subscriptions, until the agent closes."""
    setups_seen: int = 0
    garbage_seen: dict = field(default_factory=dict)


class ReceiverAgent:
    """Receives network publications into image logs (Aeron's Receiver); a duty-cycle agent."""

    def __init__(self, directory: str | os.PathLike, counters: CountersFile | None, *, clock: Clock = SYSTEM_CLOCK,
                 receiver_id: int | None = None, on_image: Callable[[ImageInfo], None] | None = None,
                 on_image_ended: Callable[[ImageInfo], None] | None = None,
                 allow: Sequence[IPv4Network | IPv6Network] | None = None, setup_key: SetupKey | None = None
                 ) -> None:
        """`directory`: where image logs are made; `counters`: where the agent's counters go and
        where the images' readers report their positions (None: the owner calls consumed_to);
        `receiver_id`: sent in every SM, random when not given; `allow`: the networks whose
        datagrams are taken (None: any address's); `setup_key`: only SETUPs signed with it make
        images (setup_key.py)."""
        self.setup_key = setup_key
        self.directory = Path(directory)
        self.counters = counters
        self._clock = clock
        self.receiver_id = random.getrandbits(63) if receiver_id is None else receiver_id
        self.on_image = on_image
        self.on_image_ended = on_image_ended
        self._allow = None if allow is None else tuple(allow)
        self._allowed: dict[str, bool] = {}
        self._endpoints: dict[Address, _ReceiveEndpoint] = {}
        self._ended: list[_AgentImage] = []
        """Ended images whose logs wait for their readers to leave."""
        self._buffer = bytearray(sockets.DATAGRAM_MAX_BYTES)
        self._view = memoryview(self._buffer)
        self.coalesced_receives = 0
        """Receives that brought several datagrams at once (UDP GRO), for tests and benches."""

    # -- subscriptions --------------------------------------------------------------------------

    def bind(self, address: Address) -> Address:
        """Open the receive socket of `address` and keep it open until close(), whatever its
        subscriptions (a service's one endpoint); returns the address bound (the port that port 0
        got), by which it is known from now on. SocketError (also an OSError) if it cannot be bound."""
        endpoint = self._endpoints.get(address)
        if endpoint is None:
            endpoint = self._open_endpoint(address)
        endpoint.kept = True
        return endpoint.address

    def add_subscription(self, channel: UdpChannel, stream_id: int, *, image_log: Path | None = None,
                         hold_for_readers: int = 0, window: int | None = None) -> Address:
        """Receive stream_id on the channel's endpoint; returns the address bound, by which the
        endpoint is known from now on (an endpoint with port 0 gets a new socket and port each
        time, unless bound first). `image_log`: the path where the stream's images are rebuilt
        (each new image replaces the file there, atomically; an ended one's file is removed only
        while it is still the one there); without it, under the agent's directory.
        `hold_for_readers`: an image's consumption stays where it joined until that many readers
        read it, however long they take (a replayer's stream, whose readers must all see its first
        message: they join at the image's first frame); by default it holds UNREAD_IMAGE_HOLD_NS at
        most. `window`: the stream's receiver window (NetworkReceiver.add_subscription). ChannelError
        for a channel without an endpoint, SocketError if the endpoint cannot be bound."""
        if channel.endpoint is None:
            raise ChannelError(f"channel {channel}: a subscription needs endpoint=")
        endpoint = self._endpoints.get(channel.endpoint)
        if endpoint is None:
            endpoint = self._open_endpoint(channel.endpoint)
        endpoint.streams[stream_id] += 1
        if image_log is not None:
            endpoint.image_logs[stream_id] = Path(image_log)
        if hold_for_readers:
            endpoint.holds[stream_id] = hold_for_readers
        endpoint.receiver.add_subscription(stream_id, window=window)
        return endpoint.address

    def remove_subscription(self, channel: UdpChannel, stream_id: int) -> None:
        """One subscription of stream_id fewer; at the last, its images end (their senders told
        with an SM with the EOS flag, sent now), and the socket closes with its last stream."""
        endpoint = self._endpoints.get(channel.endpoint)
        if endpoint is None or not endpoint.streams[stream_id]:
            return
        endpoint.streams[stream_id] -= 1
        if endpoint.streams[stream_id]:
            return
        del endpoint.streams[stream_id]
        endpoint.image_logs.pop(stream_id, None)
        endpoint.holds.pop(stream_id, None)
        now = self._clock.nanos()
        endpoint.receiver.remove_subscription(stream_id)
        self._reply(endpoint, endpoint.receiver.do_work(now))
        self._track_images(endpoint, now)
        if not endpoint.streams and not endpoint.kept:
            self._close_endpoint(endpoint, now)

    def images(self) -> list[ImageInfo]:
        """The images being received now."""
        return [image.info for endpoint in self._endpoints.values() for image in endpoint.images.values()]

    def image_counters(self, info: ImageInfo) -> CounterGroup | None:
        """The counters of a live image (None once it ended)."""
        endpoint = self._endpoints.get(info.endpoint)
        image = None if endpoint is None else endpoint.images.get((info.session_id, info.stream_id))
        return None if image is None else image.counters

    def endpoint_counters(self, address: Address) -> CounterGroup:
        """The counters of the socket bound to `address` (a channel's endpoint)."""
        return self._endpoints[address].counters

    def consumed_to(self, info: ImageInfo, position: int) -> None:
        """Without a counters file: the image's reader got to `position`."""
        endpoint = self._endpoints.get(info.endpoint)
        if endpoint is not None and (info.session_id, info.stream_id) in endpoint.images:
            endpoint.receiver.consumed_to(info.session_id, info.stream_id, position)

    def close(self) -> None:
        """Close every socket; images end without telling their senders (as a process that stops
        would), their logs closed and removed, their counters freed."""
        now = self._clock.nanos()
        for endpoint in list(self._endpoints.values()):
            self._close_endpoint(endpoint, now)
        for image in self._ended:
            self._remove_log(image)
        self._ended.clear()

    # -- the duty cycle -------------------------------------------------------------------------

    def do_work(self) -> int:
        """Read datagrams, answer, track images and their readers; returns the datagrams moved."""
        now = self._clock.nanos()
        work = 0
        for endpoint in list(self._endpoints.values()):
            if endpoint.pending:
                work += sockets.send_queued(endpoint.sock, endpoint.pending, endpoint.counters)
            work += self._read(endpoint, now)
            self._track_images(endpoint, now)
            receiver = endpoint.receiver
            if self.counters is not None:
                for image in endpoint.images.values():
                    self._read_consumption(receiver, image, now)
            replies = receiver.do_work(now)
            work += len(replies)
            self._reply(endpoint, replies)
            self._track_images(endpoint, now)
            self._update_counters(endpoint)
            if len(endpoint.sources) > len(receiver.images):
                # Keep where live images' senders are; an unknown session's SEND_SETUP went above.
                endpoint.sources = {key: endpoint.sources[key] for key in receiver.images if key in endpoint.sources}
        if self._ended:
            self._reap_ended(now)
        return work

    def _read(self, endpoint: _ReceiveEndpoint, now: int) -> int:
        buffer, view = self._buffer, self._view
        receiver, sources = endpoint.receiver, endpoint.sources
        read = 0
        while read < RECEIVER_MAX_DATAGRAMS_PER_WORK:
            length, segment_size, address = sockets.receive_batch(endpoint.sock, view)
            if address is None:
                if length == sockets.UNREACHABLE:
                    endpoint.counters["unreachable"].add(1)
                    read += 1
                    continue
                break
            if self._allow is not None and not self._is_allowed(address[0]):
                receiver.garbage[GARBAGE_NOT_ALLOWED] += 1
                read += 1
                continue
            if length >= _DATA_SESSION_STREAM_OFFSET + _SESSION_STREAM.size:
                # A coalesced batch is one sender's: its first datagram says whose.
                sources[_SESSION_STREAM.unpack_from(buffer, _DATA_SESSION_STREAM_OFFSET)] = address
            if 0 < segment_size < length:
                read += -(-length // segment_size)
                self.coalesced_receives += 1
                receiver.on_datagrams(view[:length], segment_size, now, address[0])
            else:
                read += 1
                receiver.on_datagram(view[:length], now, address[0])
        return read

    def _is_allowed(self, host: str) -> bool:
        verdict = self._allowed.get(host)
        if verdict is None:
            try:
                ip = ip_address(host.split("%", 1)[0])  # an IPv6 address may carry its scope
            except ValueError:
                ip = None
            verdict = ip is not None and any(ip in network for network in self._allow)
            if len(self._allowed) >= _ALLOWED_CACHE_MAX:
                self._allowed.clear()
            self._allowed[host] = verdict
        return verdict

    def _reply(self, endpoint: _ReceiveEndpoint, datagrams: list[bytes]) -> None:
        sources = endpoint.sources
        for datagram in datagrams:
            address = sources.get(_SESSION_STREAM.unpack_from(datagram, _CONTROL_SESSION_STREAM_OFFSET))
            if address is None:
                continue  # a session whose sender never reached this socket: nowhere to answer
            if endpoint.pending:
                endpoint.pending.append((datagram, address, endpoint.counters))
                continue
            status = sockets.send(endpoint.sock, datagram, address)
            if status == sockets.WOULD_BLOCK:
                endpoint.counters["short-sends"].add(1)
                endpoint.pending.append((datagram, address, endpoint.counters))
            elif status == sockets.UNREACHABLE:
                endpoint.counters["unreachable"].add(1)

    # -- images ---------------------------------------------------------------------------------

    def _track_images(self, endpoint: _ReceiveEndpoint, now: int) -> None:
        """Take the images the receiver ended, and make the new ones known."""
        receiver = endpoint.receiver
        if receiver.ended_images:
            for ended in receiver.ended_images:
                key = (ended.session_id, ended.stream_id)
                image = endpoint.images.get(key)
                if image is not None and image.image is ended:
                    del endpoint.images[key]
                    self._end_image(endpoint, image, now)
                else:  # made and ended within one batch (a SETUP flood's): never announced, nobody reads it
                    ended.close()
                    ended.log.close()
                    if not ended.resumed:  # a resumed log is an earlier receiver's, its readers' path
                        ended.log.path.unlink(missing_ok=True)
            receiver.ended_images.clear()
        if receiver.setups_received != endpoint.setups_seen:
            endpoint.setups_seen = receiver.setups_received
            for key, image in receiver.images.items():
                if key not in endpoint.images:
                    self._new_image(endpoint, key, image)

    def _new_image(self, endpoint: _ReceiveEndpoint, key: tuple[int, int], image: ReceiverImage) -> None:
        log_buffer = image.log
        source = endpoint.sources.get(key)
        source_address = Address(*source[:2]) if source is not None else Address("", 0)
        log_path = log_buffer.path if image.resumed else _place(log_buffer.path, endpoint.image_logs.get(key[1]))
        info = ImageInfo(key[0], key[1], log_path, image.join_position, endpoint.address, source_address)
        suffix = f"{key[0]} {key[1]} {endpoint.address} <- {source_address} {log_path.name}"
        group = CounterGroup(self.counters, IMAGE_COUNTERS, suffix,
                             key=stream_key(log_buffer.correlation_id, *key), registration_id=log_buffer.correlation_id)
        readers = None
        if self.counters is not None:
            readers = FlowControl(log_buffer, self.counters, self._clock, _NoCleaning(),
                                  liveness_timeout_s=SUBSCRIBER_LIVENESS_TIMEOUT_S, limit_counter=InMemoryCounter(),
                                  dropped_counter=InMemoryCounter())
        agent_image = _AgentImage(image, info, group, readers, os.stat(log_path).st_ino,
                                  held_for=endpoint.holds.get(key[1], 0) if readers is not None else 0)
        endpoint.images[key] = agent_image
        log.info("image of session %d stream %d from %s at %d: %s%s", key[0], key[1], source_address,
                 info.join_position, log_path, " (resumed: the log an earlier receiver left)" if image.resumed else "")
        if self.on_image is not None:
            self.on_image(info)

    def _end_image(self, endpoint: _ReceiveEndpoint, image: _AgentImage, now: int) -> None:
        """The image ends: its readers see the end of the stream; its log waits for them to leave."""
        log_buffer = image.image.log
        if image.image.end_of_stream_position is None:
            log_buffer.end_of_stream_position = image.image.rebuilt_position
        self._update_image_counters(image)
        image.counters.close()
        image.ended_ns = now
        self._ended.append(image)
        endpoint.counters["images-ended"].add(1)
        log.info("image of session %d stream %d ended at %d", image.info.session_id, image.info.stream_id,
                 min(log_buffer.end_of_stream_position, image.image.rebuilt_position))
        if self.on_image_ended is not None:
            self.on_image_ended(image.info)

    def _read_consumption(self, receiver: NetworkReceiver, image: _AgentImage, now: int) -> None:
        """The slowest live reader's position is the image's consumption (never back, never past
        what was rebuilt: a reader that joined late behind it does not move the window back).
        Without a live reader for UNREAD_IMAGE_HOLD_NS, what is rebuilt counts as consumed: a
        stream nobody reads (its reader died, or never started) never holds its sender, as a
        local log's writer is never held by readers that are not there."""
        readers = image.readers
        readers.update()
        rebuilder = image.image.rebuilder
        if image.held_for:
            if readers.subscriber_count < image.held_for:
                return
            image.held_for = 0
        if not readers.connected:
            if image.unread_since_ns is None:
                image.unread_since_ns = now
            elif now - image.unread_since_ns >= UNREAD_IMAGE_HOLD_NS \
                    and rebuilder.rebuilt_position > rebuilder.consumer_position:
                rebuilder.consumed_to(rebuilder.rebuilt_position)
            return
        image.unread_since_ns = None
        position = min(readers.limit - (rebuilder.term_length >> 1), rebuilder.rebuilt_position)
        if position > rebuilder.consumer_position:
            rebuilder.consumed_to(position)

    def _reap_ended(self, now: int) -> None:
        """Remove the logs of ended images that no live reader reads any more."""
        kept = []
        for image in self._ended:
            readers = image.readers
            if readers is not None and now - image.ended_ns <= IMAGE_READER_GRACE_NS:
                readers.update()
                if readers.connected:
                    kept.append(image)
                    continue
            self._remove_log(image)
        self._ended = kept

    @staticmethod
    def _remove_log(image: _AgentImage) -> None:
        image.image.close()
        image.image.log.close()
        path = image.info.log_path
        try:
            if os.stat(path).st_ino == image.inode:  # not a newer image's log at the same path
                path.unlink()
        except FileNotFoundError:
            pass

    def _update_counters(self, endpoint: _ReceiveEndpoint) -> None:
        for image in endpoint.images.values():
            self._update_image_counters(image)
            if image.tail_position != image.image.rebuilt_position:
                self._publish_tail(image)
        receiver, group = endpoint.receiver, endpoint.counters
        group["images"].set(len(endpoint.images))
        group["setups-received"].set(receiver.setups_received)
        group["images-resumed"].set(receiver.images_resumed)
        group["images-overtaken"].set(receiver.images_overtaken)
        group["images-rejoined"].set(receiver.images_rejoined)
        group["frames-unsubscribed"].set(receiver.frames_unsubscribed)
        group["setups-refused"].set(receiver.setups_refused)
        group["images-evicted"].set(receiver.images_evicted)
        if receiver.garbage != endpoint.garbage_seen:
            for kind, count in receiver.garbage.items():
                group.add_counter(f"garbage {kind}").set(count)
            endpoint.garbage_seen = dict(receiver.garbage)

    @staticmethod
    def _publish_tail(image: _AgentImage) -> None:
        """Set the log's tail to the rebuilt position, as a writer's tail says how far it wrote: a
        reader that joins the image late (Image without a join position, producer_position()) joins
        where the stream is now, as it would join a local log, never at a place cleaned since. All
        below the rebuilt position is whole, so a reader never finds a hole below this tail to
        unblock."""
        position = image.image.rebuilt_position
        image.image.log.set_tail_position(position)
        image.tail_position = position

    @staticmethod
    def _update_image_counters(image: _AgentImage) -> None:
        receiver_image, group = image.image, image.counters
        group["rcv-pos"].set(receiver_image.rebuilt_position)
        group["rcv-hwm"].set(receiver_image.hwm_position)
        group["naks-sent"].set(receiver_image.naks_sent)
        group["loss-gaps"].set(receiver_image.loss_gaps)
        group["sms-sent"].set(receiver_image.status_messages_sent)
        group["frames-duplicate"].set(receiver_image.frames_duplicate)
        group["frames-over-run"].set(receiver_image.frames_over_run)

    # -- sockets --------------------------------------------------------------------------------

    def _open_endpoint(self, address: Address) -> _ReceiveEndpoint:
        sock = sockets.open_receive_socket(address)
        try:
            # Bound to port 0, the socket got one: the endpoint is known by it from now on.
            name = address if address.port else sockets.local_address(sock)
            directory = self.directory / f"{name.host}_{name.port}"
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob("*.logbuffer"):
                # A receiver of this endpoint that died left them; their readers keep their mappings.
                log.info("removing %s, left by a receiver of %s that stopped", stale, name)
                stale.unlink(missing_ok=True)
            receiver = NetworkReceiver(directory, receiver_id=self.receiver_id, clock=self._clock,
                                       nak_retry_ns=AGENT_NAK_RETRY_NS, stalled_sm_ns=AGENT_STALLED_SM_NS,
                                       setup_key=self.setup_key)
            group = CounterGroup(self.counters, ENDPOINT_COUNTERS, f"receiver {name}")
        except BaseException:
            sock.close()
            raise
        endpoint = _ReceiveEndpoint(name, sock, receiver, group)
        receiver.resume_log = lambda setup: self._log_to_resume(endpoint, setup)
        self._endpoints[name] = endpoint
        return endpoint

    @staticmethod
    def _log_to_resume(endpoint: _ReceiveEndpoint, setup: SetupFrame) -> LogBuffer | None:
        """The log of the SETUP's stream at its subscription's image_log that no live image of
        ours writes and that has no end: an earlier receiver's, whose process died while readers
        still map it. The new image goes on in it (NetworkReceiver.resume_log), so they lose nothing;
        a receiver that stopped cleanly ended its logs, and a new image replaces them."""
        wanted = endpoint.image_logs.get(setup.stream_id)
        if wanted is None or not wanted.exists() or any(image.info.log_path == wanted
                                                        for image in endpoint.images.values()):
            return None
        try:
            log_buffer = LogBuffer.open(wanted)
        except (TransportError, OSError) as e:
            log.info("%s: not resumed: %s", wanted, e)
            return None
        found = (log_buffer.session_id, log_buffer.stream_id, log_buffer.initial_term_id, log_buffer.term_length,
                 log_buffer.mtu_length, log_buffer.end_of_stream_position)
        if found != (setup.session_id, setup.stream_id, setup.initial_term_id, setup.term_length, setup.mtu,
                     END_OF_STREAM_UNSET):
            log.info("%s: not resumed: its (session, stream, initial term, term length, MTU, end) are %s, the "
                     "SETUP's %s", wanted, found, (setup.session_id, setup.stream_id, setup.initial_term_id,
                                                  setup.term_length, setup.mtu))
            log_buffer.close()
            return None
        return log_buffer

    def _close_endpoint(self, endpoint: _ReceiveEndpoint, now: int) -> None:
        """Close the socket; its images end, their logs waiting for their readers (_reap_ended)."""
        self._endpoints.pop(endpoint.address, None)
        for image in list(endpoint.images.values()):
            self._end_image(endpoint, image, now)
        endpoint.images.clear()
        endpoint.receiver.ended_images.clear()
        endpoint.receiver.images.clear()  # the logs are ours to close now (_remove_log)
        endpoint.counters.close()
        endpoint.sock.close()


def _place(made: Path, wanted: Path | None) -> Path:
    """Move a new image's log from where the receiver made it to where its subscription wants it
    (one rename: a reader opening that path finds the whole new log, or the one it replaces). A
    path on another file system keeps the log where it was made, and says so."""
    if wanted is None:
        return made
    try:
        wanted.parent.mkdir(parents=True, exist_ok=True)
        os.replace(made, wanted)
    except OSError as error:
        log.warning("image log %s stays where it is, not at %s: %s", made, wanted, error.strerror or error)
        return made
    return wanted


__all__ = ["ReceiverAgent", "ImageInfo", "IMAGE_COUNTERS", "ENDPOINT_COUNTERS"]
