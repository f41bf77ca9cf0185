"""The agents as ramen netd will run them: the publication's writer in one process, the image's
reader in another, both agents in a third (this one), sharing only files: the logs and the
counters file. The writer is flow-controlled by the sender's position, the receiver by the
reader's, and the stream's end travels from the writer's close to the reader."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from pathlib import Path

from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, CountersFile, ExclusivePublication,
                             FragmentAssembler, Image, LogBuffer, LogBufferParams)
from ramen.transport import counters as ctr
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent
from tests.transport.udp.agent_rig import Rig, messages

MESSAGES = 3000
TERM_LENGTH = 65536
DEADLINE_S = 120
"""Only so that a broken stream fails instead of hanging: no test here measures time."""


def _write(log_path: str, counters_path: str, results) -> None:
    counters = CountersFile.open(counters_path)
    log_buffer = LogBuffer.open(log_path)
    publication = ExclusivePublication(log_buffer, counters)
    outcomes = {NOT_CONNECTED: 0, BACK_PRESSURED: 0}
    payloads = messages(MESSAGES)
    written = 0
    deadline = time.monotonic() + DEADLINE_S
    while written < MESSAGES and time.monotonic() < deadline:
        result = publication.offer(payloads[written])
        if result > 0:
            written += 1
        elif result != ADMIN_ACTION:
            outcomes[result] = outcomes.get(result, 0) + 1
            time.sleep(0.0001)
    publication.close()
    log_buffer.close()
    counters.close()
    results.put(("writer", written, outcomes))


def _read(images, counters_path: str, results) -> None:
    info = images.get(timeout=DEADLINE_S)
    counters = CountersFile.open(counters_path)
    log_buffer = LogBuffer.open(info["log_path"])
    image = Image(log_buffer, counters, join_position=info["join_position"])
    digest = hashlib.sha256()
    count = 0

    def on_message(buffer, offset, length, header) -> None:
        nonlocal count
        digest.update(bytes(buffer[offset:offset + length]))
        count += 1

    assembler = FragmentAssembler(on_message)
    deadline = time.monotonic() + DEADLINE_S
    while not image.is_end_of_stream and time.monotonic() < deadline:
        if not image.poll(assembler.on_fragment, 10):
            time.sleep(0.0001)
    end = image.is_end_of_stream
    image.close()
    log_buffer.close()
    counters.close()
    results.put(("reader", count, digest.hexdigest(), end))


def test_a_writer_and_a_reader_in_other_processes_stream_through_the_agents_to_the_end(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    counters_path = tmp_path / "counters.dat"
    counters = CountersFile.open(counters_path)
    log_path = tmp_path / "pub.logbuffer"
    LogBuffer.create(log_path, LogBufferParams(term_length=TERM_LENGTH, session_id=31, stream_id=41)).close()
    images, results = context.Queue(), context.Queue()
    receiver = ReceiverAgent(tmp_path / "images", counters, on_image=lambda info: images.put(
        {"log_path": str(info.log_path), "join_position": info.join_position}))
    endpoint = receiver.add_subscription(UdpChannel(endpoint=Address("127.0.0.1", 0)), 41)
    sender = SenderAgent(counters)
    writer = context.Process(target=_write, args=(str(log_path), str(counters_path), results))
    reader = context.Process(target=_read, args=(images, str(counters_path), results))
    try:
        sender.add_publication(log_path, UdpChannel(endpoint=endpoint))
        writer.start()
        reader.start()
        got = {}
        deadline = time.monotonic() + DEADLINE_S
        while (len(got) < 2 or sender.publications) and time.monotonic() < deadline:
            work = sender.do_work() + receiver.do_work()
            while not results.empty():
                item = results.get()
                got[item[0]] = item[1:]
            if not work:
                time.sleep(0.0001)
        expected = hashlib.sha256(b"".join(messages(MESSAGES))).hexdigest()
        written, outcomes = got["writer"]
        assert written == MESSAGES  # how often it waited (NOT_CONNECTED, BACK_PRESSURED) is the machine's
        assert got["reader"] == (MESSAGES, expected, True)
        assert sender.publications == []  # the receiver's EOS SM ended the linger
    finally:
        writer.join(timeout=DEADLINE_S)
        reader.join(timeout=DEADLINE_S)
        sender.close()
        receiver.close()
        counters.close()


def _leave_tethered_positions(counters_path: str, log_path: str, kinds: tuple[bool, ...]) -> None:
    """Take a tethered position on the log for each kind (True: a network sender's, False: a
    reader's, a recorder's) and die without freeing them, as a process killed with -9."""
    counters = CountersFile.open(counters_path)
    log_buffer = LogBuffer.open(log_path)
    for network_sender in kinds:
        counters.allocate(ctr.SUBSCRIBER_POSITION_TYPE_ID, f"sub-pos: left by a dead {network_sender=}",
                          key=ctr.subscriber_key(log_buffer.correlation_id, log_buffer.session_id,
                                                 log_buffer.stream_id, tether_hold_ms=0, network_sender=network_sender),
                          registration_id=log_buffer.correlation_id).set(0)
    os._exit(0)


def dead_positions(counters: CountersFile, log_buffer: LogBuffer) -> list[bool]:
    """The kinds (network sender or not) of the positions on the log that dead processes hold."""
    return sorted(ctr.is_network_sender(counters.key(i))
                  for i in counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log_buffer.correlation_id)
                  if counters.get(i, ctr.OWNER_ID_OFFSET) != os.getpid())


def test_a_sender_takes_over_the_tethered_position_a_dead_senders_process_left_and_a_recorder_the_rest(tmp_path):
    """A netd killed with -9 leaves its senders' tethered positions holding their writers (nothing
    goes unsent while it restarts); the next netd's sender of the log frees them once its own
    position holds the writer, and leaves a dead recorder's for the next recorder, and the other
    way round."""
    rig = Rig(tmp_path, seed=18, count=100, tether_hold_ms=60_000)
    try:
        def leave(*kinds: bool) -> None:
            child = multiprocessing.get_context("fork").Process(
                target=_leave_tethered_positions, args=(str(rig.counters.path), str(rig.pub_log.path), kinds))
            child.start()
            child.join()  # reaped: its pid is dead
        leave(True, False)
        assert dead_positions(rig.counters, rig.pub_log) == [False, True]

        # The dead recorder's position holds the writer to half a term: some of the stream goes.
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 20, 100_000)
        assert rig.reader.got == rig.expected[:len(rig.reader.got)]
        assert dead_positions(rig.counters, rig.pub_log) == [False]  # the recorder's is left

        leave(True)
        recorder = Image(rig.pub_log, rig.counters, tethered=True, clock=rig.clock)
        recorder.take_over_dead_tethers()
        assert dead_positions(rig.counters, rig.pub_log) == [True]  # the sender's is left
        recorder.close()
    finally:
        rig.close()
