"""ReplayPublication: nothing cleaned behind the readers, yet a reader never sees a stale frame.

The log is first filled with a whole lap of committed frames (another publication's, read back),
then written through each entry point across several term rotations while a reader follows, polling
after every write so that it always looks at the length word at the tail."""

import random
import struct
import time

import numpy as np
import pytest

from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, BufferClaim, CountersFile, ExclusivePublication,
                             FragmentAssembler, Image, LogBuffer, LogBufferParams, ReplayPublication)
from ramen.transport import frame
from ramen.transport import term_appender as appender
from ramen.transport.position import PARTITION_COUNT

TERM = 64 * 1024
TIMEOUT_S = 30
"""Safety bound for loops that wait on a reader: a test that needs it has failed."""


def params() -> LogBufferParams:
    return LogBufferParams(term_length=TERM, initial_term_id=7, session_id=5, stream_id=9)


def stale_lap(tmp_path) -> list[bytes]:
    """A whole lap of committed frames, written by an ExclusivePublication and read back: the
    bytes of its three terms."""
    log = LogBuffer.create(tmp_path / "stale.logbuffer", params())
    publication = ExclusivePublication(log)  # no counters: nothing cleaned but the term it enters
    rng = random.Random(1)
    while True:
        remaining = PARTITION_COUNT * TERM - publication.position
        message = b"\xee" * rng.randrange(1, 600)
        if publication.position >= (PARTITION_COUNT - 1) * TERM and \
                frame.align(len(message) + frame.HEADER_LENGTH) + frame.HEADER_LENGTH > remaining:
            # The last term filled to its end, without rotating into the first (which would clean it).
            assert publication.offer(b"\xee" * (remaining - frame.HEADER_LENGTH)) == PARTITION_COUNT * TERM
            break
        if publication.offer(message) == ADMIN_ACTION:
            assert publication.offer(message) > 0
    read = []
    image = Image(log, join_position=0)
    while image.poll(lambda buf, offset, length, header: read.append(length), 1000):
        pass
    assert len(read) > 3 * TERM // 700
    terms = [bytes(t) for t in log.terms]
    publication.close()
    image.close()
    log.close()
    for term in terms:  # every term holds frames from its start
        assert struct.unpack_from("<i", term, 0)[0] > 0
    return terms


def message_bytes(seq: int, length: int) -> bytes:
    return struct.pack("<I", seq) * (length // 4) + b"\x5a" * (length % 4)


class Writer:
    """Writes numbered messages through one entry point of a publication, a reader following."""

    def __init__(self, publication: ExclusivePublication, image: Image, rng: random.Random) -> None:
        self.publication = publication
        self.image = image
        self.rng = rng
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self._assembler = FragmentAssembler(lambda buf, offset, length, header:
                                            self.received.append(bytes(buf[offset:offset + length])))
        self._claim = BufferClaim()

    def poll(self) -> None:
        while self.image.poll(self._assembler.on_fragment, 1000):
            pass

    def until(self, write) -> None:
        """Call write() until it writes, following with the reader after every attempt."""
        give_up = time.monotonic() + TIMEOUT_S
        while True:
            result = write()
            self.poll()
            if result not in (BACK_PRESSURED, ADMIN_ACTION):
                assert result > 0, result
                return
            assert time.monotonic() < give_up

    def next_messages(self, n: int, max_length: int) -> list[bytes]:
        return [message_bytes(len(self.sent) + i, self.rng.randrange(1, max_length)) for i in range(n)]

    def offer(self) -> None:
        [message] = self.next_messages(1, self.publication.max_payload_length)
        self.until(lambda: self.publication.offer(message))
        self.sent.append(message)

    def offer_fragmented(self) -> None:
        [message] = self.next_messages(1, self.publication.max_message_length)
        self.until(lambda: self.publication.offer(message))
        self.sent.append(message)

    def try_claim(self) -> None:
        [message] = self.next_messages(1, self.publication.max_payload_length)

        def write():
            result = self.publication.try_claim(len(message), self._claim)
            if result > 0:
                self._claim.buffer[:] = message
                self._claim.commit()
            return result

        self.until(write)
        self.sent.append(message)

    def offer_batch(self) -> None:
        n = self.rng.randrange(1, 40)
        if self.rng.random() < 0.5:  # of one length, or of many
            length = self.rng.randrange(1, 300)
            messages = [message_bytes(len(self.sent) + i, length) for i in range(n)]
        else:
            messages = self.next_messages(n, 300)
        left = messages
        give_up = time.monotonic() + TIMEOUT_S
        while left:
            written, _ = self.publication.offer_batch(left)
            left = left[written:]
            self.poll()
            assert time.monotonic() < give_up
        self.sent.extend(messages)

    def offer_frames(self) -> None:
        messages = self.next_messages(self.rng.randrange(1, 20), 400)
        block = bytearray()
        for m in messages:  # framed elsewhere: another session, any term offset and id
            header = bytearray(frame.align(len(m) + frame.HEADER_LENGTH))
            frame.HEADER.pack_into(header, 0, len(m) + frame.HEADER_LENGTH, 0, frame.UNFRAGMENTED,
                                   frame.HDR_TYPE_DATA, 4096, 99, 98, 97, 0)
            header[frame.HEADER_LENGTH:frame.HEADER_LENGTH + len(m)] = m
            block += header
        self.until(lambda: self.publication.offer_frames(block, 0, len(block)))
        self.sent.extend(messages)

    def window(self) -> None:
        """Frames written in place in the term window, visible at commit_window; padding written
        there too when the next frame does not fit the term, as a recording holds it."""
        messages = self.next_messages(self.rng.randrange(1, 20), 400)
        p = self.publication
        give_up = time.monotonic() + TIMEOUT_S
        while True:
            available, window = p.term_window(TERM)
            if window is not None:
                term_offset = p.position & (TERM - 1)
                fit = []
                end = 0
                for m in messages:
                    aligned = frame.align(len(m) + frame.HEADER_LENGTH)
                    if end + aligned > available:
                        break
                    fit.append((m, end))
                    end += aligned
                if fit or available == TERM - term_offset:
                    break
                window.release()
            self.poll()
            assert time.monotonic() < give_up
        term_id = p.initial_term_id + (p.position >> (TERM.bit_length() - 1))
        if not fit:  # the term's end: one PAD frame to it
            frame.HEADER.pack_into(window, 0, 0, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, term_offset,
                                   p.session_id, p.stream_id, term_id, 0)
            window.release()
            assert p.commit_window(available, available) > 0
            self.poll()
            return
        for m, at in fit:  # the first frame's length word stays zero until the commit
            frame.HEADER.pack_into(window, at, len(m) + frame.HEADER_LENGTH if at else 0, 0, frame.UNFRAGMENTED,
                                   frame.HDR_TYPE_DATA, term_offset + at, p.session_id, p.stream_id, term_id, 0)
            window[at + frame.HEADER_LENGTH:at + frame.HEADER_LENGTH + len(m)] = m
        window.release()
        assert p.commit_window(end, len(fit[0][0]) + frame.HEADER_LENGTH) > 0
        self.poll()
        self.sent.extend(m for m, _ in fit)

    def mixed(self) -> None:
        getattr(self, self.rng.choice(ENTRY_POINTS[:-1]))()


ENTRY_POINTS = ["offer", "offer_fragmented", "try_claim", "offer_batch", "offer_frames", "window", "mixed"]


def stale_log(tmp_path, name: str = "replay.logbuffer") -> LogBuffer:
    """A new log whose terms hold a whole lap of committed-looking frames, at the very positions
    (term ids and offsets) the new stream writes its first lap."""
    terms = stale_lap(tmp_path)
    log = LogBuffer.create(tmp_path / name, params())
    for term, stale in zip(log.terms, terms):
        term[:] = stale
    return log


class PollingWords:
    """A term's int32 words that let the reader poll after each store: a message's fragments are
    committed one by one, and the reader follows them mid-message."""

    def __init__(self, words, poll) -> None:
        self.words = words
        self.poll = poll

    def __setitem__(self, index: int, value: int) -> None:
        self.words[index] = value
        self.poll()


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_reader_reads_exactly_what_was_written_over_a_stale_lap(tmp_path, monkeypatch, entry_point):
    log = stale_log(tmp_path)
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters, join_position=0)
    publication = ReplayPublication(log, counters)
    writer = Writer(publication, image, random.Random(entry_point))
    write_fragments = appender.write_fragments
    monkeypatch.setattr(appender, "write_fragments", lambda term, term_i32, *args:
                        write_fragments(term, PollingWords(term_i32, writer.poll), *args))
    write = getattr(writer, entry_point)
    give_up = time.monotonic() + TIMEOUT_S * 4
    while publication.position < 8 * TERM:  # more than two laps: over the stale lap, then over our own
        write()
        assert time.monotonic() < give_up
    writer.poll()
    assert image.position == publication.position
    assert len(writer.received) == len(writer.sent)
    assert writer.received == writer.sent
    publication.close()
    image.close()


def test_open_zeroes_the_length_word_at_the_tail(tmp_path):
    log = stale_log(tmp_path)
    image = Image(log, join_position=0)
    assert image.poll(lambda *args: None, 10) > 0  # the stale lap reads as frames
    image.close()
    publication = ReplayPublication(log)
    assert struct.unpack_from("<i", log.terms[0], 0)[0] == 0
    image = Image(log, join_position=0)
    assert image.poll(lambda *args: None, 10) == 0
    publication.close()
    image.close()


@pytest.mark.parametrize("cls", [ReplayPublication, ExclusivePublication])
def test_never_zeroes_behind_the_reader(tmp_path, cls):
    """Two terms and a half in, with the reader caught up: an ExclusivePublication has zeroed
    the first half of the first term (two terms behind the reader), a ReplayPublication has left
    it as written; and the stale lap past the tail is still there, but for the word at the tail.
    (An ExclusivePublication needs a clean log: it gets a new one.)"""
    log = stale_log(tmp_path) if cls is ReplayPublication else LogBuffer.create(tmp_path / "new.logbuffer", params())
    stale = [np.frombuffer(bytes(t), dtype=np.uint8) for t in log.terms]
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters, join_position=0)
    publication = cls(log, counters)
    writer = Writer(publication, image, random.Random(3))
    first_term = None
    while publication.position < 2 * TERM + TERM // 2:
        writer.offer()
        if first_term is None and publication.position >= TERM:
            first_term = np.frombuffer(bytes(log.terms[0]), dtype=np.uint8).copy()
    writer.poll()
    assert image.position == publication.position
    assert publication.subscriber_count == 1  # asking refreshes the limit: the cleaning runs
    term0 = np.frombuffer(log.terms[0], dtype=np.uint8)
    behind = term0[:TERM // 2]
    if cls is ExclusivePublication:
        assert not behind.any()
    else:
        assert (behind == first_term[:TERM // 2]).all()
        assert behind.any()
        tail = publication.position & (TERM - 1)
        term2 = np.frombuffer(log.terms[2], dtype=np.uint8)
        assert struct.unpack_from("<i", log.terms[2], tail)[0] == 0
        assert (term2[tail + 4:] == stale[2][tail + 4:]).all()
    assert writer.received == writer.sent
    del term0, behind
    publication.close()
    image.close()
