"""The agents as ramen netd will run them: the publication's writer in one process, the image's
reader in another, both agents in a third (this one), sharing only files: the logs and the
counters file. The writer is flow-controlled by the sender's position, the receiver by the
reader's, and the stream's end travels from the writer's close to the reader."""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from pathlib import Path

from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, CountersFile, ExclusivePublication,
                             FragmentAssembler, Image, LogBuffer, LogBufferParams)
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent
from tests.transport.udp.agent_rig import messages

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
