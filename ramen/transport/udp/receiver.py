"""The receiver's agent core, without sockets: what a receiving host answers a sender, and when.

The twin of NetworkSender. A NetworkReceiver takes the datagrams a sender sent (on_datagram, or a
UDP GRO batch of them back to back: on_datagrams) and returns from do_work() the datagrams to send
back: status messages (SMs), NAKs. It keeps one image per (session, stream), each an
ImageRebuilder (the log buffer rebuilt from the frames) and a StatusMessagePolicy (when an SM is
due); their rules are not repeated here. It is pure but for its injected clock, so a test drives
it datagram by datagram on a ManualClock, and the service that owns the socket (ramen netd, a later
step) only moves bytes.

Its rules are Aeron's receiver's (DataPacketDispatcher, PublicationImage, LossDetector), as the
captures in aeron-vectors/udp show them:
- A SETUP of a new (session, stream) makes an image joining at the SETUP's position (its
  activeTermId/termOffset), answered with an SM at once. DATA or a heartbeat of a session without an
  image gets an SM with SEND_SETUP and every other field 0 (a late joiner, a restarted receiver).
- SMs: the policy's rule (consumption moved past window / 4, or 200 ms passed). Like Aeron's
  next_sm_position, the position an SM reports moves only when the threshold was passed, so the SMs
  of an idle image repeat the last one (the captures' final SMs sit a little below the stream end).
- NAKs: each of the first NAK_MAX_GAPS gaps below rcv-hwm is NAKed after the unicast delay (100 us)
  and again after each retry delay (10 ms) while it stays open; a gap filled in part is a new one
  (Aeron's LossDetector tracks the first gap only: at 5% loss, repairing a window's gaps one NAK
  after another cost goodput).
- End of stream: an EOS heartbeat (or DATA frame with the EOS flag) marks where the stream ends; once
  it is rebuilt and consumed, the SMs carry the EOS flag (the C receiver only from a later pass of its
  conductor: 0.26 s and 0.5 s after the first EOS heartbeat in the captures). An image with no frame
  for the liveness timeout (10 s) ends, and the session is unknown again.
- Only streams subscribed to (add_subscription) make images; frames of others are ignored. When a
  stream's subscription is removed, each of its images sends one SM with the EOS flag and ends.
- What strangers can make it allocate is bounded (not Aeron's rule: its driver makes an image of
  every SETUP): at most max_images_per_stream images of a stream, where a new SETUP takes the place
  of the oldest image that never carried data (a SETUP flood's) or is refused, and at most
  max_images_per_source of one source address (the IP the owner names, on_datagram's `source`).
  With a setup key, only SETUPs signed with it are taken at all (setup_key.py; refused as the
  bounds refuse, counted in setups_refused).
- Speed: a datagram (or batch) that is one run of plain DATA frames landing in fresh space of an
  image goes into its log as one block (protocol.data_run, ImageRebuilder.insert_run), with no frame
  decoded; everything else goes frame by frame, by the rules above, with the same counters.
- Garbage (a datagram that is not frames, a wrong version, an unknown type, a session nobody set up,
  a frame out of its image's terms) is counted by kind and dropped; on_datagram never raises for it.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Callable

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport.errors import TransportError
from ramen.transport.frame import FRAME_ALIGNMENT, align
from ramen.transport.logbuffer import LogBuffer, LogBufferParams
from ramen.transport.position import compute_position, position_bits_to_shift, term_id_of
from ramen.transport.udp import protocol
from ramen.transport.udp.defaults import (IMAGE_LIVENESS_TIMEOUT_NS, MAX_IMAGES_PER_SOURCE, MAX_IMAGES_PER_STREAM,
                                          NAK_MAX_GAPS, NAK_RETRY_NS, NAK_UNICAST_DELAY_NS, SEND_SETUP_RETRY_NS,
                                          SETUP_REFUSED_LOG_INTERVAL_NS)
from ramen.transport.udp.protocol import (DataFrame, NakFrame, SetupFrame, StatusMessage,
                                          WireError, frames_of)
from ramen.transport.udp.rebuild import DUPLICATE, INSERTED, OVER_RUN, REJECTED, Gap, ImageRebuilder, StatusMessagePolicy
from ramen.transport.udp.setup_key import SetupKey

log = logging.getLogger(__name__)

# Kinds of garbage, the keys of NetworkReceiver.garbage.
GARBAGE_SHORT = "short"
"""Fewer bytes than a frame header."""
GARBAGE_VERSION = "version"
"""A frame whose version is not Aeron's current one (0)."""
GARBAGE_UNKNOWN_TYPE = "unknown-type"
"""A frame type Aeron does not define, or one a receiver does not take (ERR, RES, RSP_SETUP...)."""
GARBAGE_MALFORMED = "malformed"
"""A known type with a length or layout that does not fit."""
GARBAGE_UNKNOWN_SESSION = "unknown-session"
"""DATA of a (session, stream) nobody set up: answered with SEND_SETUP, dropped."""
GARBAGE_REJECTED = "rejected"
"""A frame its image refused (term out of range, misplaced offset)."""
GARBAGE_BAD_SETUP = "bad-setup"
"""A SETUP no log buffer can be made of (term length, MTU or position out of range)."""
GARBAGE_NOT_FOR_RECEIVER = "not-for-receiver"
"""A control frame a sender takes (SM, NAK, RTTM echo) sent to the receiver."""
GARBAGE_NOT_ALLOWED = "not-allowed"
"""A datagram from an address its endpoint does not take (ReceiverAgent's `allow`): not decoded."""


TIMED_OUT_KEPT = 1024
"""Images that timed out whose end a new image of theirs may begin at (_going_on_from), at most."""


class ReceiverImage:
    """One image a receiver rebuilds: the log, its rebuilder and SM policy, and the receiver's
    per-image state (the gaps being NAKed, liveness, end of stream)."""

    def __init__(self, setup: SetupFrame, log_buffer: LogBuffer, *, clock: Clock, now_ns: int,
                 window_length: int | None = None, resume: bool = False, join_position: int | None = None) -> None:
        """`resume`: `log_buffer` is the log an earlier receiver of this stream left unended, to go
        on with (ImageRebuilder.resuming; ValueError if it cannot); else a new one at the SETUP's
        position, or at `join_position`, behind it, with the gap up to it (within the window)
        to NAK."""
        self.session_id = setup.session_id
        self.stream_id = setup.stream_id
        self.log = log_buffer
        self.resumed = resume
        position = compute_position(setup.active_term_id, setup.term_offset, log_buffer.position_bits_to_shift,
                                    setup.initial_term_id)
        if resume:
            self.rebuilder = ImageRebuilder.resuming(log_buffer, position, window_length=window_length)
        else:
            rebuilder = ImageRebuilder(log_buffer, position if join_position is None else join_position,
                                       window_length=window_length)
            rebuilder.hwm_position = max(rebuilder.join_position,
                                         min(position, rebuilder.join_position + rebuilder.window_length))
            self.rebuilder = rebuilder
        self.policy = StatusMessagePolicy(self.rebuilder.window_length, clock=clock)
        self.sm_position = self.rebuilder.join_position
        """Aeron's next_sm_position: what SMs report, moved only past the policy's threshold."""
        self.last_frame_ns = now_ns
        self.pending_naks: dict[tuple[int, int], int] = {}
        self.stalled_sm_sent = False
        """An SM went for a stall (NetworkReceiver's stalled_sm_ns) and no frame came since."""
        """The gaps being NAKed, by where they start (termId, termOffset) -> when their NAK is due."""
        self.drained_at_eos_ns: int | None = None
        """When the rebuilt and consumed positions first stood at the end of stream."""
        self.is_sending_eos = False
        """The SMs carry the EOS flag: the sender may stop lingering."""
        self.is_ended = False
        """Liveness timed out or the subscription went: the owner may close its reader and the log."""
        self.source: str | None = None
        """The address (IP) its SETUP came from, when the owner said (NetworkReceiver's bounds)."""
        self.frames_duplicate = 0
        """Frames already in the log (retransmits of what arrived after all, duplicated datagrams)."""
        self.frames_over_run = 0
        """Frames past the consumer position + window: dropped, the sender sends them again."""
        self.runs_inserted = 0
        """Datagrams, or GRO batches of them, that went into the log as one block (the fast path)."""
        self.naks_sent = 0
        self.loss_gaps = 0
        self.status_messages_sent = 0

    @property
    def join_position(self) -> int:
        return self.rebuilder.join_position

    @property
    def rebuilt_position(self) -> int:
        """rcv-pos."""
        return self.rebuilder.rebuilt_position

    @property
    def hwm_position(self) -> int:
        """rcv-hwm."""
        return self.rebuilder.hwm_position

    @property
    def end_of_stream_position(self) -> int | None:
        return self.rebuilder.end_of_stream_position

    @property
    def carried_data(self) -> bool:
        """Whether anything was rebuilt past where it joined (or it goes on in an earlier log):
        an image a SETUP made and nothing followed is the first to give way to a new one."""
        return self.resumed or self.rebuilder.rebuilt_position > self.rebuilder.join_position

    def close(self) -> None:
        self.rebuilder.close()


class NetworkReceiver:
    """Rebuilds the images of every stream sent to one receiving endpoint (no socket: on_datagram
    takes what arrived, do_work returns what to send back).

    Counters are plain attributes (totals over its images; each ReceiverImage has rcv-pos, rcv-hwm,
    frames_duplicate, frames_over_run and its own): naks_sent, loss_gaps, status_messages_sent, setups_received, images_ended, and
    garbage, a Counter of dropped frames and datagrams by kind (GARBAGE_*)."""

    def __init__(self, directory: Path, *, receiver_id: int, clock: Clock = SYSTEM_CLOCK,
                 nak_delay_ns: int = NAK_UNICAST_DELAY_NS, nak_retry_ns: int = NAK_RETRY_NS,
                 liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS, receiver_window: int | None = None,
                 pre_touch: bool = False, stalled_sm_ns: int | None = None,
                 max_images_per_stream: int = MAX_IMAGES_PER_STREAM,
                 max_images_per_source: int = MAX_IMAGES_PER_SOURCE, setup_key: SetupKey | None = None) -> None:
        """`directory`: where image log buffers are created (one file per image);
        `receiver_id`: a random id fixed for this receiver's life, sent in every SM;
        `receiver_window`: Aeron's rcv-wnd, the window each image's SMs grant (default
        min(128 KiB, termLength / 2), Aeron's; capped at half a term);
        `pre_touch`: fault every page of an image's log in when it is made (Aeron's
        aeron.pre.touch.mapped.memory), so the first lap does not pay a page fault every few
        datagrams (measured under /dev/shm, on_datagram of 1408-byte datagrams into a fresh log of
        16 MiB terms: 3.0 us each, 1.7 us pre-touched).
        `stalled_sm_ns`: an image that has read all it got, with no gap, and heard nothing since its
        last SM this long ago, sends one more (once until a frame comes): a sender held at its
        limit whose SM was lost goes on then, not 200 ms later (not Aeron's: None, its default).
        `max_images_per_stream`, `max_images_per_source`: the bounds on what SETUPs make (the
        module's docstring). `setup_key`: only SETUPs signed with it are taken (setup_key.py)."""
        self.setup_key = setup_key
        self.directory = Path(directory)
        self.receiver_id = receiver_id
        self._clock = clock
        self.nak_delay_ns = nak_delay_ns
        self.nak_retry_ns = nak_retry_ns
        self.stalled_sm_ns = stalled_sm_ns
        self.liveness_timeout_ns = liveness_timeout_ns
        if receiver_window is not None and receiver_window < FRAME_ALIGNMENT:
            raise ValueError(f"receiver window {receiver_window} is less than a frame ({FRAME_ALIGNMENT} bytes)")
        self.receiver_window = receiver_window
        self.pre_touch = pre_touch
        self.max_images_per_stream = max_images_per_stream
        self.max_images_per_source = max_images_per_source
        self._source: str | None = None
        """The address the datagram being taken came from (on_datagram's `source`)."""
        self._images_by_source: Counter[str] = Counter()
        self._refused_since_log = 0
        self._refused_logged_ns: int | None = None
        self.images: dict[tuple[int, int], ReceiverImage] = {}
        self.ended_images: list[ReceiverImage] = []
        """Images that timed out, for the owner to close (their log files stay until then)."""
        self._setup_requests: dict[tuple[int, int], int] = {}
        """(session, stream) without an image -> when SEND_SETUP was last sent for it (ns)."""
        self._pending_setup_requests: list[tuple[int, int]] = []
        self._closing: list[bytes] = []
        """The EOS SMs of images whose subscription was removed, sent by the next do_work."""
        self._log_count = 0
        self.stream_ids: set[int] = set()
        self.windows: dict[int, int] = {}
        """stream id -> its own receiver window (add_subscription's), instead of `receiver_window`."""
        """The streams subscribed to: only their SETUPs make images (Aeron's receive endpoint)."""
        self.naks_sent = 0
        self.loss_gaps = 0
        self.status_messages_sent = 0
        self.setups_received = 0
        self.frames_unsubscribed = 0
        """SETUPs and DATA of streams nobody subscribed to: ignored, as Aeron does (not garbage)."""
        self.images_ended = 0
        self.images_resumed = 0
        """Images that went on in a log an earlier receiver left (resume_log)."""
        self.images_overtaken = 0
        """Images ended by a SETUP more than a term past them (their sender skipped what its writer
        overtook)."""
        self.images_rejoined = 0
        """Images begun where one that timed out stopped, behind their sender (_going_on_from)."""
        self.setups_refused = 0
        """SETUPs of new images past the bounds (max_images_per_stream, max_images_per_source)."""
        self.images_evicted = 0
        """Images that never carried data, ended to make room for a new SETUP of their stream."""
        self._timed_out: dict[tuple[int, int], int] = {}
        """(session, stream) -> where its image that timed out stopped, for the next one."""
        self.garbage: Counter[str] = Counter()
        self.resume_log: Callable[[SetupFrame], LogBuffer | None] | None = None
        """Given a SETUP, an open log of its stream that an earlier receiver left without an end,
        for the image to go on in (ReceiverImage's resume), or None; set by the owner, who knows
        where the stream's images go. None: every image is new."""

    def add_subscription(self, stream_id: int, *, window: int | None = None) -> None:
        """A subscriber wants stream_id: from now on its SETUPs make images. `window`: the stream's
        own rcv-wnd (capped at half a term), for a bulk stream that a round trip's 128 KiB would slow."""
        if window is not None and window < FRAME_ALIGNMENT:
            raise ValueError(f"receiver window {window} is less than a frame ({FRAME_ALIGNMENT} bytes)")
        self.stream_ids.add(stream_id)
        if window is not None:
            self.windows[stream_id] = window

    def remove_subscription(self, stream_id: int) -> None:
        """The last subscriber of stream_id left: its images end, each telling its sender with one
        SM with the EOS flag (the rejoin capture: one EOS SM when the subscriber closed), and its
        frames are ignored from now on."""
        self.stream_ids.discard(stream_id)
        self.windows.pop(stream_id, None)
        self._timed_out = {key: at for key, at in self._timed_out.items() if key[1] != stream_id}
        for key in [key for key in self.images if key[1] == stream_id]:
            image = self.images[key]
            self._closing.append(image.rebuilder.status_message(image.sm_position, self.receiver_id,
                                                                flags=protocol.SM_EOS_FLAG).encode())
            image.status_messages_sent += 1
            self.status_messages_sent += 1
            self._end(key)

    def _end(self, key: tuple[int, int]) -> None:
        image = self.images.pop(key)
        if image.source is not None:
            self._images_by_source[image.source] -= 1
            if not self._images_by_source[image.source]:
                del self._images_by_source[image.source]
        image.is_ended = True
        self.ended_images.append(image)
        self.images_ended += 1

    def image(self, session_id: int, stream_id: int) -> ReceiverImage | None:
        return self.images.get((session_id, stream_id))

    # -- datagrams in ---------------------------------------------------------------------------

    def on_datagram(self, datagram: bytes | bytearray | memoryview, now_ns: int | None = None,
                    source: str | None = None) -> None:
        """Take one datagram from a sender; garbage is counted and dropped, never raised.
        `source`: the address (IP) it came from, for the bounds on images per source."""
        now = self._clock.nanos() if now_ns is None else now_ns
        self._source = source
        view = _bytes_view(datagram)
        if not self._on_run(view, None, now):
            self._on_frames(view, now)

    def on_datagrams(self, buffer: bytes | bytearray | memoryview, segment_size: int,
                     now_ns: int | None = None, source: str | None = None) -> None:
        """Take datagrams of segment_size bytes back to back in buffer, the last maybe shorter (a
        batch as UDP GRO delivers it: datagram_io.receive_segments). The same as on_datagram of
        each in turn; a batch that is one run of new DATA frames of an image goes into its log as
        one block."""
        now = self._clock.nanos() if now_ns is None else now_ns
        self._source = source
        view = _bytes_view(buffer)
        size = len(view)
        if segment_size <= 0 or segment_size >= size:
            self.on_datagram(view, now)
            return
        if self._on_run(view, segment_size, now):
            return
        for start in range(0, size, segment_size):
            datagram = view[start:start + segment_size]
            if not self._on_run(datagram, None, now):
                self._on_frames(datagram, now)

    def _on_run(self, view: memoryview, segment_size: int | None, now: int) -> bool:
        """The fast path: datagrams that are one run of DATA frames (protocol.data_run) landing in
        new space of an image (ImageRebuilder.insert_run). False if not taken: nothing was done."""
        run = protocol.data_run(view, segment_size)
        if run is None:
            return False
        first_length, term_offset, session_id, stream_id, term_id, _ = run
        image = self.images.get((session_id, stream_id))
        if image is None or image.rebuilder.insert_run(view, term_id, term_offset, first_length) != INSERTED:
            return False
        image.last_frame_ns = now
        image.stalled_sm_sent = False
        image.runs_inserted += 1
        return True

    def _on_frames(self, datagram: memoryview, now: int) -> None:
        """A datagram decoded frame by frame: control frames, heartbeats, PADs, EOS, losses."""
        try:
            frames = frames_of(datagram)
        except WireError:
            self.garbage[_garbage_kind(datagram)] += 1
            return
        for item in frames:
            if isinstance(item, DataFrame):
                self._on_data(item, now)
            elif isinstance(item, SetupFrame):
                self._on_setup(item, now)
            else:
                # An RTTM request would be the sender asking (Aeron's receiver answers those only
                # with cc=cubic); without congestion control, like SMs and NAKs, it is not ours.
                self.garbage[GARBAGE_NOT_FOR_RECEIVER] += 1

    def _on_setup(self, setup: SetupFrame, now: int) -> None:
        self.setups_received += 1
        if setup.stream_id not in self.stream_ids:
            self.frames_unsubscribed += 1
            return
        if self.setup_key is not None and not self.setup_key.verifies(setup):
            # Before anything else: an unsigned SETUP past an image's position would end it.
            self._refuse(setup, now, "not signed with the setup key" if setup.tag is None else
                         "signed with another key than ours")
            return
        key = (setup.session_id, setup.stream_id)
        current = self.images.get(key)
        if current is not None:
            rebuilder = current.rebuilder
            position = rebuilder.position_of(setup.active_term_id, setup.term_offset)
            if position <= rebuilder.rebuilt_position + rebuilder.term_length:
                return  # the same sender again, or a new one that goes back to us (NetworkSender.on_status)
            # The sender is more than a term past where the image was rebuilt to: what lies between
            # is gone from its log (its writer overtook it while nobody received), and the gap would
            # never fill. The image ends there, and a new one begins at the sender's position.
            log.warning("session %d stream %d: the sender went on at %d, %d bytes past where its image was "
                        "rebuilt to, which it no longer holds: a new image there", setup.session_id,
                        setup.stream_id, position, position - rebuilder.rebuilt_position)
            self.images_overtaken += 1
            self._end(key)
        if not self._admit(setup, now):
            return
        window = self.windows.get(setup.stream_id, self.receiver_window)
        window = None if window is None else min(window, setup.term_length // 2)
        image = self._resumed(setup, now, window)
        if image is not None:
            self._add(key, image)
            return
        path = self.directory / f"{setup.session_id}-{setup.stream_id}-{self._log_count}.logbuffer"
        self._log_count += 1
        log_buffer = None
        try:
            bits = position_bits_to_shift(setup.term_length)
            position = compute_position(setup.active_term_id, setup.term_offset, bits, setup.initial_term_id)
            join = self._going_on_from(key, position, setup.term_length)
            term_id, term_offset = (setup.active_term_id, setup.term_offset) if join is None else \
                (term_id_of(join, bits, setup.initial_term_id), join & (setup.term_length - 1))
            log_buffer = LogBuffer.create(path, LogBufferParams(
                term_length=setup.term_length, mtu_length=setup.mtu, initial_term_id=setup.initial_term_id,
                session_id=setup.session_id, stream_id=setup.stream_id, term_id=term_id,
                term_offset=term_offset), pre_touch=self.pre_touch)
            image = ReceiverImage(setup, log_buffer, clock=self._clock, now_ns=now, window_length=window,
                                  join_position=join)
        except (ValueError, TransportError) as error:  # a term length, MTU or position no log can have
            self.garbage[GARBAGE_BAD_SETUP] += 1
            log.debug("SETUP of session %d stream %d dropped: %s", setup.session_id, setup.stream_id, error)
            if log_buffer is not None:
                log_buffer.close()
            path.unlink(missing_ok=True)
            return
        if join is not None:
            self.images_rejoined += 1
            log.info("session %d stream %d: a new image where the one that timed out stopped, %d, %d bytes "
                     "behind its sender", setup.session_id, setup.stream_id, join, position - join)
        self._add(key, image)

    def _add(self, key: tuple[int, int], image: ReceiverImage) -> None:
        image.source = self._source
        if image.source is not None:
            self._images_by_source[image.source] += 1
        self.images[key] = image
        self._setup_requests.pop(key, None)

    def _admit(self, setup: SetupFrame, now: int) -> bool:
        """Whether a SETUP of a new image is within the bounds, making room in its stream by
        ending the oldest image that never carried data if it must; a refusal is counted and
        logged (once in SETUP_REFUSED_LOG_INTERVAL_NS, with the count since)."""
        source = self._source
        if source is not None and self._images_by_source[source] >= self.max_images_per_source:
            return self._refuse(setup, now, f"{source} has {self.max_images_per_source} images, its most")
        stream = [key for key in self.images if key[1] == setup.stream_id]
        if len(stream) < self.max_images_per_stream:
            return True
        idle = [key for key in stream if not self.images[key].carried_data]
        if not idle:
            return self._refuse(setup, now, f"stream {setup.stream_id} has {len(stream)} images carrying data, "
                                             "its most")
        evicted = min(idle, key=lambda key: self.images[key].last_frame_ns)
        log.info("session %d stream %d: image ended, nothing came after its SETUP, to make room for session %d",
                 evicted[0], evicted[1], setup.session_id)
        self._end(evicted)
        self.images_evicted += 1
        return True

    def _refuse(self, setup: SetupFrame, now: int, why: str) -> bool:
        self.setups_refused += 1
        self._refused_since_log += 1
        if self._refused_logged_ns is None or now - self._refused_logged_ns >= SETUP_REFUSED_LOG_INTERVAL_NS:
            log.warning("SETUP of session %d stream %d from %s refused: %s (%d refused since the last such line)",
                        setup.session_id, setup.stream_id, self._source or "an unnamed source", why,
                        self._refused_since_log)
            self._refused_logged_ns = now
            self._refused_since_log = 0
        return False

    def _going_on_from(self, key: tuple[int, int], sender_position: int, term_length: int) -> int | None:
        """Where a new image of `key` begins, if not at its sender's position: after one that timed
        out (its sender silent for the liveness timeout: a netd restarted late, a network cut),
        where that one stopped, if the sender is at most a term past it (it goes back there,
        NetworkSender.on_status, or NAKs bring the gap), so its readers, who read the old image
        to its end, lose nothing."""
        ended = self._timed_out.pop(key, None)
        if ended is None:
            return None
        return ended if 0 < sender_position - ended <= term_length else None

    def _resumed(self, setup: SetupFrame, now: int, window: int | None) -> ReceiverImage | None:
        """The image going on in the log `resume_log` finds for the SETUP (an earlier receiver's,
        left unended), if the sender is within its reach; None otherwise (a new image then)."""
        log_buffer = self.resume_log(setup) if self.resume_log is not None else None
        if log_buffer is None:
            return None
        try:
            image = ReceiverImage(setup, log_buffer, clock=self._clock, now_ns=now, window_length=window, resume=True)
        except ValueError as e:
            log.info("%s: not resumed for session %d stream %d: %s", log_buffer.path, setup.session_id,
                     setup.stream_id, e)
            log_buffer.close()
            return None
        self.images_resumed += 1
        return image

    def _on_data(self, item: DataFrame, now: int) -> None:
        key = (item.session_id, item.stream_id)
        image = self.images.get(key)
        if image is None:
            if item.stream_id not in self.stream_ids:
                self.frames_unsubscribed += 1
                return
            self.garbage[GARBAGE_UNKNOWN_SESSION] += 1
            last = self._setup_requests.get(key)
            if last is None or now - last > SEND_SETUP_RETRY_NS:
                self._setup_requests[key] = now
                self._pending_setup_requests.append(key)
            return
        status = image.rebuilder.insert(item)
        if status == REJECTED:
            self.garbage[GARBAGE_REJECTED] += 1
            return
        if status == DUPLICATE:
            image.frames_duplicate += 1
        elif status == OVER_RUN:
            image.frames_over_run += 1
        image.last_frame_ns = now
        image.stalled_sm_sent = False
        if status == INSERTED and item.is_eos and not item.is_heartbeat \
                and image.rebuilder.end_of_stream_position is None:
            # The rebuilder marks EOS from heartbeats; a DATA frame with EOS ends the stream at its end.
            rebuilder = image.rebuilder
            end = rebuilder.position_of(item.term_id, item.term_offset) + align(item.frame_length)
            rebuilder.end_of_stream_position = end
            rebuilder.log.end_of_stream_position = end

    # -- the image's reader ---------------------------------------------------------------------

    def consumed_to(self, session_id: int, stream_id: int, position: int) -> None:
        """The image's reader (a subscriber) got to position: the window moves, SMs report it."""
        self.images[(session_id, stream_id)].rebuilder.consumed_to(position)

    # -- the duty cycle -------------------------------------------------------------------------

    def do_work(self, now_ns: int | None = None) -> list[bytes]:
        """The datagrams to send back now: SEND_SETUP requests, then per image its NAK and SM."""
        now = self._clock.nanos() if now_ns is None else now_ns
        out = self._closing
        self._closing = []
        out += [StatusMessage(session_id, stream_id, 0, 0, 0, 0, flags=protocol.SM_SEND_SETUP_FLAG).encode()
               for session_id, stream_id in self._pending_setup_requests]
        self.status_messages_sent += len(self._pending_setup_requests)
        self._pending_setup_requests = []
        if self._setup_requests:
            # Forget requests past their retry time, so a flood of made-up session ids stays bounded.
            self._setup_requests = {key: t for key, t in self._setup_requests.items()
                                    if now - t <= SEND_SETUP_RETRY_NS}
        ended = []
        for key, image in self.images.items():
            if now - image.last_frame_ns > self.liveness_timeout_ns:
                ended.append(key)
                continue
            self._check_drained(image, now)
            out += [nak.encode() for nak in self._naks_due(image, now)]
            sm = self._sm_due(image, now)
            if sm is not None:
                out.append(sm.encode())
        for key in ended:
            image = self.images[key]
            self._end(key)
            self._timed_out[key] = image.rebuilt_position
            if len(self._timed_out) > TIMED_OUT_KEPT:  # SETUPs of made-up sessions stay bounded
                del self._timed_out[next(iter(self._timed_out))]
            log.info("image of session %d stream %d ended: no frame for %.1f s (rcv-pos %d)", key[0], key[1],
                     self.liveness_timeout_ns / 1e9, image.rebuilt_position)
        return out

    def _naks_due(self, image: ReceiverImage, now: int) -> list[NakFrame]:
        """Aeron's LossDetector for each of the first NAK_MAX_GAPS gaps (Aeron's tracks the first
        only): each NAKed after the delay, again after each retry; a gap that changed where it
        starts (filled in part) is a new one."""
        gaps: list[Gap] = image.rebuilder.gaps(limit=NAK_MAX_GAPS)
        if not gaps:
            image.pending_naks.clear()
            return []
        pending = image.pending_naks
        kept: dict[tuple[int, int], int] = {}
        naks = []
        for gap in gaps:
            key = (gap.term_id, gap.term_offset)
            due = pending.get(key)
            if due is None:
                due = now + self.nak_delay_ns
                image.loss_gaps += 1
                self.loss_gaps += 1
            if now >= due:
                due = now + self.nak_retry_ns
                naks.append(image.rebuilder.nak(gap))
            kept[key] = due
        image.pending_naks = kept
        image.naks_sent += len(naks)
        self.naks_sent += len(naks)
        return naks

    @staticmethod
    def _check_drained(image: ReceiverImage, now: int) -> None:
        """Note when the image's end of stream was first rebuilt and consumed."""
        rebuilder = image.rebuilder
        eos = rebuilder.end_of_stream_position
        if eos is not None and image.drained_at_eos_ns is None and rebuilder.consumer_position >= eos \
                and rebuilder.rebuilt_position >= eos:
            image.drained_at_eos_ns = now
            image.is_sending_eos = True

    def _sm_due(self, image: ReceiverImage, now: int) -> StatusMessage | None:
        rebuilder = image.rebuilder
        consumed = rebuilder.consumer_position
        policy = image.policy
        if not policy.due(consumed):
            if self.stalled_sm_ns is None or image.stalled_sm_sent or now - policy.last_sent_ns <= self.stalled_sm_ns \
                    or not consumed == rebuilder.rebuilt_position == rebuilder.hwm_position:
                return None
            image.stalled_sm_sent = True  # the sender may be held by an SM that was lost: one more
            image.sm_position = consumed
        # The policy says due on progress or on timeout; only progress past its threshold moves the
        # position reported (Aeron's next_sm_position), a timeout repeats the last one.
        if policy.last_position is None or consumed > policy.last_position + policy.threshold:
            image.sm_position = consumed
        flags = protocol.SM_EOS_FLAG if image.is_sending_eos else 0
        policy.sent(image.sm_position)
        image.status_messages_sent += 1
        self.status_messages_sent += 1
        return rebuilder.status_message(image.sm_position, self.receiver_id, flags=flags)

    def close(self) -> None:
        """Release every image's log views (the files stay for whoever reads them)."""
        for image in [*self.images.values(), *self.ended_images]:
            image.close()
        self.images.clear()
        self._images_by_source.clear()
        self.ended_images.clear()


def _bytes_view(datagram) -> memoryview:
    """A datagram as a flat view of bytes (a memoryview of another format is cast, nothing copied)."""
    view = datagram if isinstance(datagram, memoryview) else memoryview(datagram)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


_TYPES_DECODED = frozenset((protocol.HDR_TYPE_PAD, protocol.HDR_TYPE_DATA, protocol.HDR_TYPE_SETUP,
                            protocol.HDR_TYPE_SM, protocol.HDR_TYPE_NAK, protocol.HDR_TYPE_RTTM))


def _garbage_kind(datagram) -> str:
    """Why a datagram is not frames: the kind of the first frame that does not decode (only called
    after frames_of refused it, so the cold path may decode twice)."""
    view = memoryview(datagram).cast("B")
    offset = 0
    while offset + protocol.COMMON_LENGTH <= len(view):
        _, version, _, frame_type = protocol.COMMON.unpack_from(view, offset)
        if version != protocol.CURRENT_VERSION:
            return GARBAGE_VERSION
        if frame_type not in _TYPES_DECODED:
            return GARBAGE_UNKNOWN_TYPE
        try:
            item = protocol.decode_frame(view, offset)
        except WireError:
            return GARBAGE_MALFORMED
        offset = align(offset + item.wire_length)
    return GARBAGE_SHORT if offset == 0 else GARBAGE_MALFORMED


__all__ = ["NetworkReceiver", "ReceiverImage", "GARBAGE_SHORT", "GARBAGE_VERSION", "GARBAGE_UNKNOWN_TYPE",
           "GARBAGE_MALFORMED", "GARBAGE_UNKNOWN_SESSION", "GARBAGE_REJECTED", "GARBAGE_BAD_SETUP",
           "GARBAGE_NOT_FOR_RECEIVER", "GARBAGE_NOT_ALLOWED"]
