"""The agents' books: a send the kernel refuses (EAGAIN) is sent later and nothing is lost, two
publications share a socket and each gets its own control frames, a position the publication
dropped is taken again, and a receiver without a counters file is told its consumption."""

from __future__ import annotations

import errno
import os
import socket

from ramen.clocks import ManualClock
from ramen.transport import (NOT_CONNECTED, CountersFile, ExclusivePublication, FragmentAssembler, Image,
                             LogBuffer, LogBufferParams)
from ramen.transport import counters as ctr
from ramen.transport.position import compute_position
from ramen.transport.udp.channel import Address, ChannelError, UdpChannel
from ramen.transport.udp.protocol import DataFrame, StatusMessage, frames_of
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent
from ramen.transport.udp.sockets import SocketError
from tests.transport.udp.agent_rig import TERM_LENGTH, Rig, messages

WINDOW = TERM_LENGTH // 2


def _stream(tmp_path, counters, clock, name: str, session_id: int, stream_id: int = 5):
    log_buffer = LogBuffer.create(tmp_path / name, LogBufferParams(term_length=TERM_LENGTH, session_id=session_id,
                                                                   stream_id=stream_id))
    return log_buffer, ExclusivePublication(log_buffer, counters, clock=clock)


def test_datagrams_the_kernel_refuses_with_eagain_go_later_in_order_and_nothing_is_lost(tmp_path):
    # A UDP send on loopback never meets a full send buffer (the kernel hands the datagram over at
    # once), so the sender's socket is swapped for a real AF_UNIX datagram socket, whose peer's
    # queue fills: the agent's own EAGAIN path, with real sends refused by a real kernel.
    clock = ManualClock()
    counters = CountersFile.open(tmp_path / "counters.dat")
    log_buffer, publication = _stream(tmp_path, counters, clock, "pub.logbuffer", 42)
    agent = SenderAgent(counters, clock=clock)
    placeholder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    placeholder.bind(("127.0.0.1", 0))
    network = agent.add_publication(log_buffer.path, UdpChannel(endpoint=Address(*placeholder.getsockname())))
    ours, peer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"\0ramen-eagain-{id(tmp_path)}"
    ours.bind(name + "-agent")
    peer.bind(name + "-peer")
    ours.connect(name + "-peer")
    peer.connect(name + "-agent")
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the smallest: a few datagrams
    network.endpoint.sock.close()
    network.endpoint.sock = ours
    expected = messages(300)
    written = 0
    received_end = 0
    ends = []
    buffer = bytearray(65536)
    try:
        for cycle in range(20_000):  # bounded: a stream that never completes fails, not hangs
            clock.advance(50e-6)
            while written < len(expected) and publication.offer(expected[written]) > 0:
                written += 1
            peer.send(_sm(log_buffer, received_end))  # the peer consumed all it got
            agent.do_work()
            agent.do_work()  # a second cycle before the peer reads: what EAGAIN refused waits
            if cycle % 3 == 0:
                continue  # the peer is slow now and then: the queue fills
            peer.setblocking(False)
            while True:
                try:
                    length = peer.recv_into(buffer)
                except BlockingIOError:
                    break
                for item in frames_of(bytes(buffer[:length])):
                    if isinstance(item, DataFrame) and not item.is_heartbeat:
                        start = compute_position(item.term_id, item.term_offset, log_buffer.position_bits_to_shift,
                                                 log_buffer.initial_term_id)
                        assert start == received_end, "a DATA frame lost or out of order"
                        received_end = start + (TERM_LENGTH - item.term_offset if item.is_pad else item.wire_length)
                        ends.append(received_end)
            if written == len(expected) and received_end == publication.position:
                break
        assert received_end == publication.position and written == len(expected)
        assert network.counters.get("short-sends") > 0
        assert network.counters.get("retransmits") == 0  # nothing was asked again: nothing was lost
    finally:
        agent.close()
        peer.close()
        placeholder.close()
        publication.close()
        log_buffer.close()
        counters.close()


def _sm(log_buffer: LogBuffer, position: int) -> bytes:
    bits = log_buffer.position_bits_to_shift
    return StatusMessage(log_buffer.session_id, log_buffer.stream_id, log_buffer.initial_term_id + (position >> bits),
                         position & (log_buffer.term_length - 1), WINDOW, 1).encode()


def test_two_publications_share_a_socket_and_each_gets_its_own_control_frames(tmp_path):
    rig = Rig(tmp_path, seed=11, count=120)
    second_log, second = _stream(tmp_path, rig.counters, rig.clock, "second.logbuffer", 999, 1003)
    try:
        network = rig.sender.add_publication(second_log.path, UdpChannel(endpoint=rig.proxy.address))
        assert network.endpoint is rig.network_publication.endpoint  # one socket for both
        assert rig.sender.local_address(network) == rig.sender.local_address(rig.network_publication)
        payloads = messages(80)
        sent = 0

        def done() -> bool:
            nonlocal sent
            while sent < len(payloads) and second.offer(payloads[sent]) > 0:
                sent += 1
            return len(rig.readers) == 2 and all(len(r.got) == (120 if r.info.session_id == 888 else 80)
                                                 for r in rig.readers)

        rig.run_until(done, 100_000)
        by_session = {r.info.session_id: r.got for r in rig.readers}
        assert by_session == {888: rig.expected, 999: payloads}
        assert rig.counter("sms-received", "888 1003") > 0 and rig.counter("sms-received", "999 1003") > 0
        assert rig.counter("sub-pos", "pub.logbuffer ->") == rig.publication.position
        assert rig.counter("sub-pos", "second.logbuffer ->") == second.position
    finally:
        second.close()
        second_log.close()
        rig.close()


def test_a_sender_position_the_publication_dropped_is_taken_again_with_the_next_sm(tmp_path):
    rig = Rig(tmp_path, seed=12, count=200)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 50, 100_000)
        rig.clock.advance(6.0)  # the sender agent did not run: its heartbeat is 6 s old
        rig.reader.poll()
        assert rig.publication.offer(b"x") == NOT_CONNECTED  # the publication dropped it (nothing written)
        assert rig.sender_position_statuses() == [ctr.COUNTER_DROPPED]
        rig.run_until(lambda: len(rig.reader.got) == 200, 100_000)
        assert rig.reader.got == rig.expected
        assert rig.sender_position_statuses() == [ctr.COUNTER_ACTIVE]
    finally:
        rig.close()


def test_a_receiver_without_a_counters_file_is_told_its_consumption_by_its_owner(tmp_path):
    clock = ManualClock()
    log_buffer = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(term_length=TERM_LENGTH, session_id=3,
                                                                              stream_id=4))
    publication = ExclusivePublication(log_buffer)  # no counters: nothing holds it back
    images = []
    receiver = ReceiverAgent(tmp_path / "images", None, clock=clock, on_image=images.append)
    endpoint = receiver.add_subscription(UdpChannel(endpoint=Address("127.0.0.1", 0)), 4)
    sender = SenderAgent(None, clock=clock)
    network = sender.add_publication(log_buffer.path, UdpChannel(endpoint=endpoint))
    expected = messages(40)
    got = []
    image = None
    assembler = FragmentAssembler(
        lambda buffer, offset, length, header: got.append(bytes(buffer[offset:offset + length])))
    try:
        for _ in range(20_000):
            clock.advance(50e-6)
            sender.do_work()
            receiver.do_work()
            if images and image is None:
                image = Image(LogBuffer.open(images[0].log_path), join_position=images[0].join_position)
                for payload in expected:
                    assert publication.offer(payload) > 0
            if image is not None:
                image.poll(assembler.on_fragment, 1)
                receiver.consumed_to(images[0], image.position)
            if len(got) == len(expected):
                break
        assert got == expected
        # Longer than a window: without the owner's consumed_to the sender would have stopped there.
        assert publication.position > WINDOW
        assert network.counters.get("snd-pos") == publication.position
    finally:
        if image is not None:
            image.close()
            image.log.close()
        sender.close()
        receiver.close()
        publication.close()
        log_buffer.close()


def test_a_bound_endpoint_stays_without_subscriptions_and_a_port_in_use_is_a_one_line_os_error(tmp_path):
    receiver = ReceiverAgent(tmp_path / "images", None, clock=ManualClock())
    try:
        bound = receiver.bind(Address("127.0.0.1", 0))
        assert bound.port
        channel = UdpChannel(endpoint=bound)
        assert receiver.add_subscription(channel, 7) == bound
        receiver.remove_subscription(channel, 7)
        assert receiver.endpoint_counters(bound) is not None  # still open: bound for the agent's life
        other = ReceiverAgent(tmp_path / "other", None)
        try:
            other.bind(bound)
        except OSError as error:
            assert isinstance(error, SocketError) and error.errno == errno.EADDRINUSE
            assert str(error) == f"receiver socket on {bound}: {os.strerror(errno.EADDRINUSE)}"
        else:
            raise AssertionError("a second socket bound the same port")
        finally:
            other.close()
    finally:
        receiver.close()


def test_a_channel_that_contradicts_its_log_is_a_channel_error(tmp_path):
    log_buffer = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(term_length=TERM_LENGTH, mtu_length=1408))
    agent = SenderAgent(None)
    try:
        for channel in (UdpChannel(endpoint=Address("127.0.0.1", 9), mtu=4096),
                        UdpChannel(control=Address("127.0.0.1", 9))):
            try:
                agent.add_publication(log_buffer.path, channel)
            except ChannelError as error:
                assert "\n" not in str(error)
            else:
                raise AssertionError(f"{channel} accepted")
        assert agent.publications == []
    finally:
        agent.close()
        log_buffer.close()


def test_images_of_a_subscription_go_to_its_image_log_and_a_restarted_senders_image_replaces_the_file(tmp_path):
    clock = ManualClock()
    counters = CountersFile.open(tmp_path / "counters.dat")
    image_log = tmp_path / "received" / "net" / "parent.logbuffer"
    receiver = ReceiverAgent(tmp_path / "images", counters, clock=clock)
    endpoint = receiver.bind(Address("127.0.0.1", 0))
    receiver.add_subscription(UdpChannel(endpoint=endpoint), 6, image_log=image_log)
    logs, publications, senders, readers = [], [], [], []

    def start_sender(session_id: int) -> None:
        log_buffer, publication = _stream(tmp_path, counters, clock, f"pub-{session_id}.logbuffer", session_id, 6)
        sender = SenderAgent(counters, clock=clock)
        sender.add_publication(log_buffer.path, UdpChannel(endpoint=endpoint))
        logs.append(log_buffer)
        publications.append(publication)
        senders.append(sender)

    def stream(payloads: list[bytes]) -> list[bytes]:
        got = []
        assembler = FragmentAssembler(
        lambda buffer, offset, length, header: got.append(bytes(buffer[offset:offset + length])))
        written = 0
        for _ in range(20_000):
            clock.advance(50e-6)
            while written < len(payloads) and publications[-1].offer(payloads[written]) > 0:
                written += 1
            senders[-1].do_work()
            receiver.do_work()
            images = [info for info in receiver.images() if info.session_id == publications[-1].session_id]
            if images and len(readers) < len(publications):
                assert images[0].log_path == image_log
                log_buffer = LogBuffer.open(image_log)  # as a worker reads its parent's log: by its path
                readers.append(Image(log_buffer, counters, join_position=images[0].join_position, clock=clock))
            if len(readers) == len(publications):
                readers[-1].poll(assembler.on_fragment, 16)
            if len(got) == len(payloads):
                return got
        raise AssertionError("the stream did not complete")

    try:
        start_sender(501)
        assert stream(messages(30)) == messages(30)
        first_inode = os.stat(image_log).st_ino
        senders[0].close()  # the sender dies; another comes with a new session
        start_sender(502)
        assert stream(messages(20)) == messages(20)
        assert os.stat(image_log).st_ino != first_inode
        clock.advance(11.0)  # the first image's liveness runs out
        senders[1].do_work()
        receiver.do_work()
        assert [info.session_id for info in receiver.images()] == [502]
        readers[0].close()
        readers[0].log.close()
        receiver.do_work()  # the first image's log goes, but not the file now at its path
        assert os.stat(image_log).st_ino != first_inode
    finally:
        for reader in readers:
            if not reader.is_closed:
                reader.close()
                reader.log.close()
        for sender in senders:
            sender.close()
        receiver.close()
        for publication, log_buffer in zip(publications, logs):
            publication.close()
            log_buffer.close()
        counters.close()


def test_the_agents_send_and_receive_batches_of_datagrams_where_the_kernel_can(tmp_path):
    """Straight from the sender agent to the receiver agent (no proxy, which forwards one datagram
    at a time): GSO sends reach the GRO socket coalesced, and the stream is whole and in order."""
    import pytest

    from ramen.transport.udp import datagram_io
    if not (datagram_io.gso_supported() and datagram_io.gro_supported()):
        pytest.skip("this kernel has no UDP GSO or GRO: the agents send and receive one datagram a call")
    clock = ManualClock()
    counters = CountersFile.open(tmp_path / "counters.dat")
    log_buffer, publication = _stream(tmp_path, counters, clock, "pub.logbuffer", 77)
    images = []
    receiver = ReceiverAgent(tmp_path / "images", counters, clock=clock, on_image=images.append)
    endpoint = receiver.add_subscription(UdpChannel(endpoint=Address("127.0.0.1", 0)), 5)
    sender = SenderAgent(counters, clock=clock)
    sender.add_publication(log_buffer.path, UdpChannel(endpoint=endpoint))
    expected = [b"%030d" % i for i in range(3000)]
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda b, o, n, h: got.append(bytes(b[o:o + n])))
    image = None
    written = 0
    try:
        for _ in range(20_000):  # bounded: a stream that never completes fails, not hangs
            clock.advance(50e-6)
            while written < len(expected) and publication.offer(expected[written]) > 0:
                written += 1
            sender.do_work()
            receiver.do_work()
            if image is None and images:
                image = Image(LogBuffer.open(images[0].log_path), counters, join_position=images[0].join_position,
                              clock=clock)
            if image is not None:
                image.poll(assembler.on_fragment, 1000)
            if len(got) == len(expected):
                break
        assert got == expected
        assert receiver.coalesced_receives > 0
    finally:
        if image is not None:
            image.close()
        sender.close()
        receiver.close()
        publication.close()
        counters.close()
