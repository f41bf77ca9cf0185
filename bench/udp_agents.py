"""A lossless loopback run through the UDP agents, in one process: an ExclusivePublication writes, a
SenderAgent sends its log over a real UDP socket on 127.0.0.1, a ReceiverAgent rebuilds the image,
and an Image reads it, all driven in turn by one loop (so the figures are one core's work, the
agents' duty cycles included). Prints MB/s and msgs/s per message size and MTU.

    PYTHONPATH=. python bench/udp_agents.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ramen.transport import CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferParams
from ramen.transport.defaults import IPC_TERM_LENGTH, MAX_UDP_PAYLOAD_LENGTH
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent

STREAM_ID = 1001


def run(directory: Path, message_length: int, mtu: int, seconds: float, batch: int) -> tuple[float, float]:
    counters = CountersFile.open(directory / "counters.dat")
    pub_log = LogBuffer.create(directory / f"pub-{message_length}-{mtu}.logbuffer", LogBufferParams(
        term_length=IPC_TERM_LENGTH, mtu_length=mtu, session_id=7, stream_id=STREAM_ID), pre_touch=True)
    publication = ExclusivePublication(pub_log, counters)
    images: list = []
    receiver = ReceiverAgent(directory / "images", counters, on_image=images.append)
    endpoint = receiver.add_subscription(UdpChannel(endpoint=Address("127.0.0.1", 0)), STREAM_ID)
    sender = SenderAgent(counters)
    sender.add_publication(pub_log.path, UdpChannel(endpoint=endpoint))
    message = bytes(message_length)
    messages = [message] * batch
    image = None
    read = 0

    def count(buffer, offset, length, session_id, term_id) -> None:
        pass

    start = None
    try:
        deadline = time.monotonic() + 10 * seconds
        while time.monotonic() < deadline:
            if batch > 1:
                publication.offer_batch(messages)
            else:
                publication.offer(message)
            sender.do_work()
            receiver.do_work()
            if image is None and images:
                image = Image(LogBuffer.open(images[0].log_path), counters, join_position=images[0].join_position)
            if image is not None:
                while image.block_poll(count, 1 << 20):
                    pass
                if start is None:
                    start, start_position = time.perf_counter(), image.position
                elif time.perf_counter() - start >= seconds:
                    break
        elapsed = time.perf_counter() - start
        read = image.position - start_position
    finally:
        if image is not None:
            image.close()
            image.log.close()
        sender.close()
        receiver.close()
        publication.close()
        pub_log.close()
        counters.close()
    full, remainder = divmod(message_length, mtu - 32)  # the frames of one message in the log
    log_bytes_per_message = full * mtu + ((remainder + 32 + 31) // 32 * 32 if remainder else 0)
    messages_read = read / log_bytes_per_message
    return messages_read * message_length / elapsed / 1e6, messages_read / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for length, mtu, batch in ((65536, 1408, 1), (65536, MAX_UDP_PAYLOAD_LENGTH, 1), (32, 1408, 256),
                                   (32, MAX_UDP_PAYLOAD_LENGTH, 256)):
            sub = Path(directory) / f"{length}-{mtu}"
            sub.mkdir()
            mb_s, msgs_s = run(sub, length, mtu, args.seconds, batch)
            print(f"{length:>6} B messages, MTU {mtu:>5}: {mb_s:8.1f} MB/s of messages, {msgs_s:12,.0f} msgs/s")


if __name__ == "__main__":
    main()
