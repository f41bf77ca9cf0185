"""The sender's core, without sockets: what a network publication puts on the wire, and when.

A NetworkSender reads a publication's log buffer (the one ExclusivePublication writes) and returns
the datagrams to send from do_work(); the control frames the receiver sends back are handed to
on_status, on_nak and on_rttm. It is pure but for its injected clock, so a test drives it frame by
frame and moment by moment (ramen.clocks.ManualClock), and the service that owns the socket
(ramen netd, a later step) only moves bytes.

Its rules are Aeron's NetworkPublication's, as the captures in aeron-vectors/udp show them:
- SETUP at once and every 100 ms until the first SM (the stream is NOT_CONNECTED until then); an
  SM with SEND_SETUP (a receiver that lost the image, or a late joiner) makes it send a SETUP at
  once at its current position, and every 100 ms until an ordinary SM comes.
- DATA between snd-pos and snd-lmt, where snd-lmt = the highest (consumption position + receiver
  window) an SM told (unicast flow control). Frames are sent as the log holds them, several per
  datagram up to the MTU, never split; a PAD is sent header-only and ends its datagram (Aeron's
  TermScanner counts it as its 32 bytes against the limit). Nothing is sent first past snd-lmt.
- pub-lmt = snd-pos + term window: how far the publication may write, so a writer far ahead of
  the network is back pressured and never overwrites what was not sent.
- A NAK sends the range again from the log (up to a term behind snd-pos, never past it) at once
  (Aeron's unicast retransmit delay 0), then ignores NAKs of the same range for the linger (10 ms).
- A heartbeat (a 0-length DATA frame at snd-pos) when nothing was sent for 100 ms, with the EOS
  flag once the publication closed and everything was sent; an RTTM request is echoed at once.
- Beyond Aeron: a sender started on a log mid-stream (netd restarted, its sends added again where
  the logs' tails are) whose first SM tells of a receiver behind snd-pos, by at most a term (an
  image the previous sender built), goes back to that receiver's position and sends on from there:
  the receiver loses nothing that the log still holds. Aeron's new sender would have a new
  session, and the receiver a new image, with the gap lost.
- Beyond Aeron too: a writer more than a term past snd-pos (nothing held it while the receiver was
  gone) makes snd-pos skip to its tail, with a SETUP there (_skip_if_overtaken): what lay behind may
  be overwritten, and no NAK of it could be answered. Aeron's publication does not write while not
  connected.

Speed: first transmissions are found many frames at a time (frame_walk.walk) and cut into datagrams
by bisection, not scanned frame by frame; with views=True they are memoryviews of the log (no copy)
for a caller that sends them before its next do_work (_scan_run says why that is safe).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import frame
from ramen.transport.frame import (HDR_TYPE_DATA, HDR_TYPE_PAD, HEADER_LENGTH, KIND_WORD_INDEX, LENGTH_WORD,
                                   TERM_ID_WORD, TERM_OFFSET_WORD, TYPE_SHIFT_IN_KIND, align)
from ramen.transport.frame_walk import walk
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.position import PARTITION_COUNT, compute_position, term_id_of
from ramen.transport.udp.defaults import (HEARTBEAT_IDLE_NS, RETRANSMIT_MAX_ACTIVE,
                                          RETRANSMIT_UNICAST_LINGER_NS, SENDER_MAX_DATAGRAMS_PER_WORK,
                                          SETUP_RETRY_NS)
from ramen.transport.udp.protocol import (NakFrame, RttMeasurement, SetupFrame, StatusMessage, heartbeat)
from ramen.transport.udp.setup_key import SetupKey


_UNIFORM_SCALAR_MAX_FRAMES = 16
"""Up to this many frames a uniform run's headers are unpacked one by one; past it numpy's fixed cost
(~10 us) is the cheaper."""


class NetworkSender:
    """Sends one publication's log buffer over the wire (no socket: do_work returns datagrams).

    Counters are plain attributes, read by whoever publishes them (ramen netd, ramen stat):
    sender_position (snd-pos), sender_limit (snd-lmt), publisher_limit (pub-lmt),
    back_pressure_events (snd-bpe), naks_received, retransmits, retransmitted_bytes,
    heartbeats_sent, setups_sent, status_messages_received."""

    def __init__(self, log_buffer: LogBuffer, *, clock: Clock = SYSTEM_CLOCK, term_window_length: int | None = None,
                 ttl: int = 0, views: bool = False,
                 max_datagrams_per_work: int = SENDER_MAX_DATAGRAMS_PER_WORK,
                 retransmit_linger_ns: int = RETRANSMIT_UNICAST_LINGER_NS, setup_key: SetupKey | None = None) -> None:
        """`log_buffer`: the publication's log; the stream starts where its tail is now.
        `term_window_length`: how far the publication may run ahead of snd-pos (Aeron's
        publication term window, half a term by default).
        `views`: do_work returns first transmissions of DATA as memoryviews of the log instead of
        bytes, saving a copy a datagram, for a caller that sends them before its next do_work
        (_scan_run says why they hold until then; kept longer, the writer may overwrite them) and
        releases them before the log is closed.
        `max_datagrams_per_work`: the DATA datagrams one do_work may send; an agent sending by UDP
        GSO may raise it to one GSO send's worth (datagram_io.MAX_GSO_SEGMENTS).
        `setup_key`: its SETUPs are signed with it (setup_key.py), for a receiver that asks."""
        self.setup_key = setup_key
        self.retransmit_linger_ns = retransmit_linger_ns
        """NAKs of a range sent again are ignored this long (Aeron's 10 ms; netd's agents: 1 ms)."""
        self.log = log_buffer
        self._clock = clock
        self.term_length = log_buffer.term_length
        self.bits = log_buffer.position_bits_to_shift
        self.mask = self.term_length - 1
        self.initial_term_id = log_buffer.initial_term_id
        self.session_id = log_buffer.session_id
        self.stream_id = log_buffer.stream_id
        self.mtu = log_buffer.mtu_length
        self.ttl = ttl
        self.views = views
        self.max_datagrams_per_work = max_datagrams_per_work
        self.term_window_length = self.term_length // 2 if term_window_length is None else term_window_length
        if not 0 < self.term_window_length <= self.term_length // 2:
            raise ValueError(f"term window {self.term_window_length} must be in 1..{self.term_length // 2} "
                             f"(half a term)")
        self._terms = log_buffer.terms
        now = clock.nanos()
        self.sender_position = log_buffer.producer_position()
        self.sender_limit = self.sender_position
        """No window before the first SM: nothing is sent that no receiver asked for."""
        self.is_connected = False
        """An SM came (Aeron's hasInitialConnection); before it, offers see NOT_CONNECTED."""
        self.resumed_from: int | None = None
        """The position the first SM took snd-pos back to, if it did (a receiver that kept its image)."""
        self._send_setup = True
        # Aeron starts both timers one timeout in the past: the first SETUP goes at once, and so
        # does the first heartbeat once connected with nothing to send.
        self._last_setup_ns = now - SETUP_RETRY_NS - 1
        self._last_data_or_heartbeat_ns = now - HEARTBEAT_IDLE_NS - 1
        self._stalled = False
        self._retransmits: dict[tuple[int, int], int] = {}
        """(termId, termOffset) of a NAKed range -> when its linger ends (ns)."""
        self._control: list[bytes] = []
        """Datagrams due at once (RTTM echoes, retransmits), sent first by the next do_work."""
        self._idle = True
        """The last do_work sent no DATA: the writer may have run on meanwhile (_skip_if_overtaken)."""
        self.skipped_to: int | None = None
        """Where snd-pos last skipped to (_skip_if_overtaken): SETUPs go until an SM from there."""
        self.skips = 0
        self.skipped_bytes = 0
        self.back_pressure_events = 0
        self.naks_received = 0
        self.retransmits = 0
        self.retransmitted_bytes = 0
        self.heartbeats_sent = 0
        self.setups_sent = 0
        self.status_messages_received = 0

    # -- what the publication sees --------------------------------------------------------------

    @property
    def publisher_limit(self) -> int:
        """pub-lmt: the position the publication may write up to. Before the first SM it is
        snd-pos (nothing may be written: NOT_CONNECTED); after, snd-pos + the term window."""
        if not self.is_connected:
            return self.sender_position
        return self.sender_position + self.term_window_length

    @property
    def is_end_of_stream(self) -> bool:
        """The publication closed and everything it wrote was sent."""
        return self.log.end_of_stream_position <= self.sender_position

    # -- the duty cycle -------------------------------------------------------------------------

    def do_work(self, now_ns: int | None = None) -> list[bytes]:
        """The datagrams to send now, in order: control replies, SETUP, DATA, or a heartbeat.
        `now_ns`: the duty cycle's time if the caller read it already, from the same clock."""
        now = self._clock.nanos() if now_ns is None else now_ns
        out = self._control
        self._control = []
        if self._idle:  # sending, snd-pos holds the writer: it cannot be a term ahead
            self._skip_if_overtaken()
        if self._send_setup and now - self._last_setup_ns > SETUP_RETRY_NS:
            out.append(self._setup_frame().encode())
            self._last_setup_ns = now
            self.setups_sent += 1
        sent = self._send_data(out)
        self._idle = not sent
        if sent:
            self._last_data_or_heartbeat_ns = now
        elif self.is_connected and now - self._last_data_or_heartbeat_ns > HEARTBEAT_IDLE_NS:
            term_id = term_id_of(self.sender_position, self.bits, self.initial_term_id)
            out.append(heartbeat(term_id, self.sender_position & self.mask, self.session_id, self.stream_id,
                                 eos=self.is_end_of_stream).encode())
            self._last_data_or_heartbeat_ns = now
            self.heartbeats_sent += 1
        if self._retransmits:
            self._retransmits = {key: end for key, end in self._retransmits.items() if end > now}
        return out

    def _skip_if_overtaken(self) -> None:
        """A writer more than a term past snd-pos (nobody held it: the receiver was gone for the
        connection timeout) may soon write over what is still to be sent, and over the term behind
        it that NAKs may ask for: snd-pos skips to the writer's tail, and a SETUP there tells the
        receiver, which ends its image and begins a new one (NetworkReceiver._on_setup). The rows
        between are lost to it, counted in skipped_bytes. Looked at only after a do_work that sent
        nothing: a sender that sends is connected, and snd-pos holds its writer to half a term."""
        tail = self.log.producer_position()
        if tail - self.sender_position <= self.term_length:
            return
        self.skipped_bytes += tail - self.sender_position
        self.skips += 1
        self.sender_position = self.sender_limit = self.skipped_to = tail
        self._send_setup = True
        self._last_setup_ns = self._clock.nanos() - SETUP_RETRY_NS - 1
        self._retransmits.clear()

    def _send_data(self, out: list) -> int:
        """First transmissions between snd-pos and snd-lmt; the datagrams sent."""
        sent = 0
        most = self.max_datagrams_per_work
        while sent < most:
            window = self.sender_limit - self.sender_position
            if window > self.mtu:
                # Many frames at once where the window allows (views of the log, not copies); what
                # the run cannot take (a PAD, a frame past the window, the stall) is the scan's below.
                count = self._scan_run(self.sender_position, window, most - sent, out)
                if count:
                    self._stalled = False
                    sent += count
                    continue
            datagram, advance = self._scan(self.sender_position, min(window, self.mtu)) if window > 0 else (b"", 0)
            if not datagram:
                # Held by the receiver (a committed frame is there but does not fit the window):
                # counted once per stall, not per duty cycle, so the count says how often.
                if not self._stalled and window < self.mtu and self._scan(self.sender_position, self.mtu)[1]:
                    self._stalled = True
                    self.back_pressure_events += 1
                break
            self._stalled = False
            out.append(datagram)
            self.sender_position += advance
            sent += 1
        return sent

    def _scan_run(self, position: int, max_length: int, max_datagrams: int, out: list) -> int:
        """Append to out the datagrams of the committed DATA frames from position, up to max_length
        bytes, packed as _scan packs them (whole frames, up to the MTU each), as bytes, or with
        `views` as memoryviews of the term; moves snd-pos past them; returns how many. The frames
        are found by frame_walk.walk (one numpy pass where there are many, frame by frame where
        few), which stops at the first length not yet committed (a batch's block holds minus its
        length until its commit) and at a frame of another term id (the lap before). A PAD (at a
        term's end, or in mid-term in a replayer's log), sent header-only at the end of its
        datagram, is left to _scan: the run stops before the datagram that would take it.

        Why views hold until the next do_work: the writer may write up to pub-lmt, snd-pos plus the
        term window (at most half a term), and zeroes a partition when it enters it (or two terms
        behind its slowest reader), while these bytes lie at most a window (at most half a term)
        behind snd-pos: the writer comes back to their partition only a lap (three terms) on."""
        term = self._terms[(position >> self.bits) % PARTITION_COUNT]
        offset = position & self.mask
        stop = offset + min(max_length, self.term_length - offset, max_datagrams * self.mtu)
        if frame.INT32.unpack_from(term, offset)[0] <= 0:
            return 0  # caught up with the writer: nothing committed here yet (no walk of what is not)
        term_id = term_id_of(position, self.bits, self.initial_term_id)
        count = self._uniform_run(term, offset, stop, term_id, max_datagrams, out)
        if count:
            return count
        found = walk(term, offset, stop, term_id=term_id)
        if not len(found):
            return 0
        _, ends, _, types, _ = found.columns()
        if HDR_TYPE_PAD in types:
            # The run stops before a PAD wherever it lies: a replayer's log pads the messages out of
            # its range in mid-term (Aeron's logs, only a term's end), and a PAD in the middle of a
            # datagram makes the whole datagram garbage to the receiver.
            del ends[types.index(HDR_TYPE_PAD):]
            if not ends:
                return 0
        last = ends[-1]
        mtu = self.mtu
        cuts: list[int] = []
        i = 0
        at = offset
        while at < last and len(cuts) < max_datagrams:
            i = bisect_right(ends, at + mtu, i)
            at = ends[i - 1]
            cuts.append(at)
        if at == last and last < self.term_length and self._pad_at(term, last):
            # The datagram before a PAD takes the PAD's header too, if it fits: _scan packs that one.
            cuts.pop()
        start = offset
        for end in cuts:
            out.append(term[start:end] if self.views else bytes(term[start:end]))
            start = end
        self.sender_position += start - offset
        return len(cuts)

    def _uniform_run(self, term, offset: int, stop: int, term_id: int, max_datagrams: int, out: list) -> int:
        """_scan_run's shortcut where frames repeat the first one's length (a batch of equal
        messages, a message's MTU-sized fragments): groups of mtu // aligned such frames, each
        followed by another such frame (so the packing could not have put more in), are datagrams
        cut by arithmetic, their headers checked (committed length, own offset, term id, DATA) by
        one numpy pass over a strided view, or a few unpacks. Then the datagram after them is
        packed frame by frame, as far as frames fit (a message's last, shorter fragment, the next
        message's first), unless a PAD follows (whose header it may take: _scan's). Returns how
        many datagrams; 0 if the first frame is not a committed DATA frame."""
        length, _, _, frame_type = frame.LENGTH_FLAGS_TYPE.unpack_from(term, offset)
        if length <= 0 or frame_type != HDR_TYPE_DATA:
            return 0
        aligned = align(length)
        per_datagram = self.mtu // aligned
        frames = min((stop - offset) // aligned, max_datagrams * per_datagram + 1)
        count = 0
        if frames > per_datagram:
            # The frame after the first group first: where frames do not repeat (a short fragment
            # before a long one), one unpack says so, not a pass over what is not headers.
            probe = offset + per_datagram * aligned
            fields = frame.HEADER_BY_WORD.unpack_from(term, probe)
            if fields[0] == length and fields[2] == probe and fields[5] == term_id:
                if frames <= _UNIFORM_SCALAR_MAX_FRAMES:
                    at = offset
                    while count < frames:
                        fields = frame.HEADER_BY_WORD.unpack_from(term, at)
                        if fields[0] != length or fields[1] >> 16 != HDR_TYPE_DATA or fields[2] != at \
                                or fields[5] != term_id:
                            break
                        count += 1
                        at += aligned
                else:
                    stride = aligned >> 2
                    headers = np.frombuffer(term, dtype=np.int32, count=frames * stride,
                                            offset=offset).reshape(frames, stride)
                    fits = (headers[:, LENGTH_WORD] == length) & (headers[:, TERM_ID_WORD] == term_id) \
                        & (headers[:, TERM_OFFSET_WORD] == np.arange(offset, offset + frames * aligned, aligned)) \
                        & ((headers[:, KIND_WORD_INDEX] >> TYPE_SHIFT_IN_KIND) == HDR_TYPE_DATA)
                    count = frames if fits.all() else int(fits.argmin())
        datagrams = (count - 1) // per_datagram if count else 0
        step = per_datagram * aligned
        views = self.views
        at = offset
        for _ in range(datagrams):
            out.append(term[at:at + step] if views else bytes(term[at:at + step]))
            at += step
        if datagrams < max_datagrams:
            end = at + (count - datagrams * per_datagram) * aligned if count else at
            mtu = self.mtu
            while end + HEADER_LENGTH <= stop:
                fields = frame.HEADER_BY_WORD.unpack_from(term, end)
                next_end = end + align(fields[0])
                if fields[0] <= 0 or fields[1] >> 16 != HDR_TYPE_DATA or fields[2] != end or fields[5] != term_id \
                        or next_end - at > mtu or next_end > stop:
                    break
                end = next_end
            if end > at and not (end < self.term_length and self._pad_at(term, end)):
                out.append(term[at:end] if views else bytes(term[at:end]))
                datagrams += 1
                at = end
        self.sender_position += at - offset
        return datagrams

    @staticmethod
    def _pad_at(term, offset: int) -> bool:
        """Whether a committed PAD frame starts at offset."""
        length, _, _, frame_type = frame.LENGTH_FLAGS_TYPE.unpack_from(term, offset)
        return length > 0 and frame_type == HDR_TYPE_PAD

    def _scan(self, position: int, max_length: int) -> tuple[bytes, int]:
        """The committed frames from position that fit max_length bytes, as one datagram, and how
        far the position moves (a PAD is sent as its header but moves to the end of its term).
        Aeron's TermScanner.scanForAvailability."""
        term = self._terms[(position >> self.bits) % PARTITION_COUNT]
        offset = position & self.mask
        limit = min(max_length, self.term_length - offset)
        available = padding = 0
        while available < limit:
            frame_length, _, _, frame_type = frame.LENGTH_FLAGS_TYPE.unpack_from(term, offset + available)
            if frame_length <= 0:
                break
            aligned = align(frame_length)
            if frame_type == HDR_TYPE_PAD:
                padding = aligned - HEADER_LENGTH
                aligned = HEADER_LENGTH
            if available + aligned > limit:
                padding = 0
                break
            available += aligned
            if padding:
                break
        if not available:
            return b"", 0
        return bytes(term[offset:offset + available]), available + padding

    def _setup_frame(self) -> SetupFrame:
        setup = SetupFrame(self.sender_position & self.mask, self.session_id, self.stream_id, self.initial_term_id,
                           term_id_of(self.sender_position, self.bits, self.initial_term_id), self.term_length,
                           self.mtu, self.ttl)
        return setup if self.setup_key is None else self.setup_key.sign(setup)

    # -- control frames in ----------------------------------------------------------------------

    def _ours(self, item) -> bool:
        return item.session_id == self.session_id and item.stream_id == self.stream_id

    def on_status(self, sm: StatusMessage) -> None:
        """An SM: the receiver's consumption position and window move snd-lmt (never back), or,
        with SEND_SETUP, a SETUP goes at once (the receiver has no image of this stream)."""
        if not self._ours(sm):
            return
        self.status_messages_received += 1
        if sm.is_setup_request:
            self._send_setup = True
            self._last_setup_ns = self._clock.nanos() - SETUP_RETRY_NS - 1
            return
        position = compute_position(sm.consumption_term_id, sm.consumption_term_offset, self.bits,
                                    self.initial_term_id)
        if not self.is_connected and self.sender_position - self.term_length <= position < self.sender_position \
                and not position % frame.FRAME_ALIGNMENT:
            self.sender_position = self.sender_limit = position  # resumed where the receiver is
            self.resumed_from = position
        self.sender_limit = max(self.sender_limit, position + sm.receiver_window)
        self.is_connected = True
        if self.skipped_to is None or position >= self.skipped_to:
            self._send_setup = False  # after a skip, only the new image's SMs say the SETUP came

    def on_nak(self, nak: NakFrame) -> None:
        """A NAK: the range goes again with the next do_work, unless it was sent again less than
        the linger ago; a range outside [snd-pos - term, snd-pos) is not ours to resend."""
        if not self._ours(nak):
            return
        self.naks_received += 1
        now = self._clock.nanos()
        key = (nak.term_id, nak.term_offset)
        if self._retransmits.get(key, now) > now or len(self._retransmits) >= RETRANSMIT_MAX_ACTIVE:
            return
        position = compute_position(nak.term_id, nak.term_offset, self.bits, self.initial_term_id)
        if not self.sender_position - self.term_length <= position < self.sender_position or nak.length <= 0 \
                or nak.term_offset % frame.FRAME_ALIGNMENT:
            return
        # Aeron's unicast retransmit delay is 0 (RETRANSMIT_UNICAST_DELAY_NS): the resend is due now.
        self._retransmits[key] = now + self.retransmit_linger_ns
        self.retransmits += 1
        end = min(position + nak.length, self.sender_position, (position | self.mask) + 1)
        while position < end:
            datagram, advance = self._scan(position, min(end - position, self.mtu))
            if not datagram:
                # A frame longer than what is left of the range: Aeron sends it whole.
                datagram, advance = self._scan(position, self.mtu)
                if not datagram:
                    break
            self._control.append(datagram)
            self.retransmitted_bytes += len(datagram)
            position += advance

    def on_rttm(self, rttm: RttMeasurement) -> None:
        """An RTTM request is echoed with the next do_work: same timestamp and receiver id, flags 0."""
        if not self._ours(rttm) or not rttm.is_reply_requested:
            return
        self._control.append(RttMeasurement(self.session_id, self.stream_id, rttm.echo_timestamp_ns, 0,
                                            rttm.receiver_id).encode())


__all__ = ["NetworkSender"]
