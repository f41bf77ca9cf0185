"""A sender agent and a receiver agent on 127.0.0.1 with the lossy proxy between them, a real
ExclusivePublication writing, and a real reader of each rebuilt image (its own mapping of the log,
reporting its position in the counters file as any reader does), all driven one duty cycle at a
time on a ManualClock by the test."""

from __future__ import annotations

from pathlib import Path

from ramen.clocks import ManualClock
from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, CountersFile, ExclusivePublication, FragmentAssembler,
                             Image, LogBuffer, LogBufferParams)
from ramen.transport.position import compute_position
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.protocol import DataFrame, StatusMessage, WireError, frames_of
from ramen.transport.udp.receiver_agent import ImageInfo, ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent
from ramen.transport.udp.setup_key import SetupKey
from tests.transport.udp.lossy_proxy import Faults, LossyProxy
from tests.vectors import LOGBUFFER_LENS, expected_payload

TERM_LENGTH, MTU, SESSION_ID, STREAM_ID = 65536, 1408, 888, 1003
TICK_S = 50e-6
"""One duty cycle of every agent moves the clock this much (the NAK delay is 100 us: two cycles)."""


def messages(count: int) -> list[bytes]:
    return [expected_payload(i, LOGBUFFER_LENS) for i in range(count)]


def is_data(datagram: bytes) -> bool:
    try:
        return isinstance(frames_of(datagram)[0], DataFrame)
    except WireError:
        return False


class Reader:
    """A subscriber of one image: its own mapping of the log, an Image reporting its position."""

    def __init__(self, info: ImageInfo, counters: CountersFile, clock: ManualClock, *, late: bool = False) -> None:
        """`late`: join where the log's tail is now (as a reader of any log does without a join
        position), not at the image's join position."""
        self.info = info
        self.log = LogBuffer.open(info.log_path)
        self.image = Image(self.log, counters, join_position=None if late else info.join_position, clock=clock)
        self.got: list[bytes] = []
        self.assembler = FragmentAssembler(
            lambda buffer, offset, length, header: self.got.append(bytes(buffer[offset:offset + length])))

    def poll(self, fragments: int = 64) -> int:
        return self.image.poll(self.assembler.on_fragment, fragments)

    def close(self) -> None:
        if not self.image.is_closed:
            self.image.close()
            self.log.close()


class Rig:
    def __init__(self, tmp_path: Path, *, seed: int = 1, forward: Faults = Faults(), backward: Faults = Faults(),
                 count: int = 200, term_length: int = TERM_LENGTH, mtu: int = MTU, hold_for_readers: int = 0,
                 image_log: Path | None = None, tether_hold_ms: int | None = None, allow=None,
                 process_share: float | None = None, receiver_counters: CountersFile | None = None,
                 sender_key: SetupKey | None = None, receiver_key: SetupKey | None = None) -> None:
        """`process_share`: of the counters file's records, what the rig's mapping may hold (its
        default); `receiver_counters`: the receiver agent's own mapping of the file, another bound;
        `sender_key`, `receiver_key`: the agents' setup keys."""
        self.tmp_path = tmp_path
        self.allow = allow
        self.receiver_key = receiver_key
        self.clock = ManualClock()
        self.counters = CountersFile.open(tmp_path / "counters.dat", **(
            {} if process_share is None else {"process_share": process_share}))
        self.receiver_counters = receiver_counters or self.counters
        self.term_length = term_length
        self.pub_log = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(
            term_length=term_length, mtu_length=mtu, session_id=SESSION_ID, stream_id=STREAM_ID))
        self.publication = ExclusivePublication(self.pub_log, self.counters, clock=self.clock)
        self.images_dir = tmp_path / "images"
        self.readers: list[Reader] = []
        self.ended: list[ImageInfo] = []
        self.receiver = self.new_receiver()
        self.image_log = image_log
        self.endpoint = self.receiver.add_subscription(UdpChannel(endpoint=Address("127.0.0.1", 0)), STREAM_ID,
                                                       hold_for_readers=hold_for_readers, image_log=image_log)
        self.proxy = LossyProxy(self.endpoint, seed=seed, forward=forward, backward=backward)
        self.sender = SenderAgent(self.counters, clock=self.clock, setup_key=sender_key)
        self.network_publication = self.sender.add_publication(
            self.pub_log.path, UdpChannel(endpoint=self.proxy.address, mtu=mtu), tether_hold_ms=tether_hold_ms)
        self.expected = messages(count)
        self.written = 0
        self.offer_results: list[int] = []
        self.reader_fragments = 64

    def new_receiver(self) -> ReceiverAgent:
        return ReceiverAgent(self.images_dir, self.receiver_counters, clock=self.clock, receiver_id=77,
                             on_image=lambda info: self.readers.append(Reader(info, self.counters, self.clock)),
                             on_image_ended=self.ended.append, allow=self.allow, setup_key=self.receiver_key)

    @property
    def reader(self) -> Reader:
        return self.readers[-1]

    def position(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.pub_log.position_bits_to_shift, self.pub_log.initial_term_id)

    def write(self) -> None:
        while self.written < len(self.expected) and not self.publication.is_closed:
            result = self.publication.offer(self.expected[self.written])
            if result == ADMIN_ACTION:
                continue
            if result < 0:
                self.offer_results.append(result)
                return
            self.written += 1

    def tick(self, *, write: bool = True, read: bool = True) -> None:
        self.clock.advance(TICK_S)
        if write:
            self.write()
        self.sender.do_work()
        self.proxy.do_work()
        if self.receiver is not None:
            self.receiver.do_work()
        self.proxy.do_work()
        if read:
            for reader in self.readers:
                if not reader.image.is_closed:
                    reader.poll(self.reader_fragments)

    def run_until(self, done, max_ticks: int, **tick) -> int:
        """Tick until done(); bounded, so a stream that never completes fails instead of hanging."""
        for ticks in range(max_ticks):
            if done():
                return ticks
            self.tick(**tick)
        raise AssertionError(f"not done after {max_ticks} duty cycles")

    def counter(self, type_name: str, label_part: str = "") -> int:
        """The value of the one counter of a type whose label contains label_part."""
        found = [c.value for c in self.counters.counters() if c.type_name == type_name and label_part in c.label]
        assert len(found) == 1, (type_name, label_part, found)
        return found[0]

    def has_counter(self, type_name: str, label_part: str = "") -> bool:
        return any(c.type_name == type_name and label_part in c.label for c in self.counters.counters())

    def sender_position_statuses(self) -> list[int]:
        """The statuses of the sender agents' positions in the writers' flow control (sub-pos counters
        labelled `... -> <endpoint>`)."""
        return [c.status for c in self.counters.counters() if c.type_name == "sub-pos" and "->" in c.label]

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self.sender.close()
        if self.receiver is not None:
            self.receiver.close()
        self.proxy.close()
        if not self.publication.is_closed:
            self.publication.close()
        self.pub_log.close()
        self.counters.close()


def sm_limit(rig: Rig, datagram: bytes) -> int | None:
    """An SM's consumption position + window (None for anything else, and SEND_SETUP SMs)."""
    try:
        items = frames_of(datagram)
    except WireError:
        return None
    limits = [rig.position(i.consumption_term_id, i.consumption_term_offset) + i.receiver_window
              for i in items if isinstance(i, StatusMessage) and not i.is_setup_request]
    return max(limits) if limits else None


__all__ = ["Rig", "Reader", "Faults", "BACK_PRESSURED", "TERM_LENGTH", "MTU", "SESSION_ID", "STREAM_ID", "TICK_S",
           "messages", "is_data", "sm_limit"]
