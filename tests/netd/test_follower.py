"""netd's key follower (ramen/netd/follower.py) driving real agents over 127.0.0.1, from a real
built-in confserver: what the site's net/ keys ask is what is sent and received."""

from __future__ import annotations

import os

import pytest

import confserver
from ramen import keyspace
from ramen.clocks import ManualClock
from ramen.netd.contract import NetReceive, NetSend
from ramen.netd.defaults import LOG_CHECK_INTERVAL_S, NEW_LOG_CHECK_INTERVAL_S, NEW_LOG_WAIT_S
from ramen.netd.follower import KeyFollower, NetdCounters
from ramen.transport import (ADMIN_ACTION, CountersFile, ExclusivePublication, FragmentAssembler, Image, LogBuffer,
                             LogBufferParams)
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent

STREAM = 77
MAX_CYCLES = 200_000
"""Duty cycles a step may take at most: a stream that never arrives fails instead of hanging."""


class TwoSites:
    """The edge sends, the core receives: each site its follower and agents, one counters file."""

    def __init__(self, tmp_path, url: str, auth_file) -> None:
        self.clock = ManualClock()
        self.client = confserver.connect(url, identity="admin", auth_file=auth_file)
        self.counters = CountersFile.open(tmp_path / "counters.dat")
        self.receiver = ReceiverAgent(tmp_path / "core-net", self.counters)
        self.endpoint = UdpChannel(endpoint=self.receiver.bind(Address("127.0.0.1", 0)))
        self.sender = SenderAgent(self.counters)
        self.edge_counters = NetdCounters.allocate(self.counters, "edge")
        self.core_counters = NetdCounters.allocate(self.counters, "core")
        idle_receiver = ReceiverAgent(tmp_path / "edge-net", self.counters)
        self.parts = [idle_receiver, self.sender, self.receiver]
        self.edge = KeyFollower(self.client, "edge", self.sender, idle_receiver, self.endpoint, self.edge_counters,
                                clock=self.clock)
        self.core = KeyFollower(self.client, "core", SenderAgent(self.counters), self.receiver, self.endpoint,
                                self.core_counters, clock=self.clock)
        self.out = tmp_path / "edge" / "out.logbuffer"
        self.received = tmp_path / "core" / "received" / "out.logbuffer"
        self.out.parent.mkdir()
        self.publication: ExclusivePublication | None = None
        self.image: Image | None = None
        self.got: list[bytes] = []
        self.assembler = FragmentAssembler(lambda b, o, n, h: self.got.append(bytes(b[o:o + n])))

    def write_log(self) -> None:
        if self.publication is not None:
            self.publication.close()
            self.publication.log.close()
            os.unlink(self.out)
        log = LogBuffer.create(self.out, LogBufferParams(term_length=65536, session_id=5, stream_id=STREAM))
        self.publication = ExclusivePublication(log, self.counters)

    def cycle(self) -> None:
        self.clock.advance(LOG_CHECK_INTERVAL_S)  # each cycle may look for logs again
        self.edge.do_work()
        self.core.do_work()
        for part in self.parts:
            part.do_work()
        if self.image is None and self.received.exists():
            self.image = Image(LogBuffer.open(self.received), self.counters)
        if self.image is not None:
            self.image.poll(self.assembler.on_fragment, 100)

    def until(self, done, what: str) -> None:
        for _ in range(MAX_CYCLES):
            if done():
                return
            self.cycle()
        raise AssertionError(f"not done: {what}")

    def send(self, messages: list[bytes]) -> None:
        pending = list(messages)
        for _ in range(MAX_CYCLES):
            while pending:
                result = self.publication.offer(pending[0])
                if result == ADMIN_ACTION:
                    continue
                if result < 0:
                    break
                pending.pop(0)
            if not pending:
                return
            self.cycle()
        raise AssertionError(f"{len(pending)} messages never written")

    def close(self) -> None:
        for follower in (self.edge, self.core):
            follower.close()
        for part in self.parts:
            part.close()
        if self.image is not None:
            self.image.close()
        if self.publication is not None:
            self.publication.close()
        self.client.close()
        self.counters.close()


@pytest.fixture
def sites(tmp_path, fresh_confserver):
    both = TwoSites(tmp_path, fresh_confserver.url, fresh_confserver.auth_file)
    yield both
    both.close()


def test_a_send_and_a_receive_carry_a_log_to_the_other_site_in_order(sites):
    send_key = f"{keyspace.net_sends_prefix('edge')}/p/f@core"
    receive_key = f"{keyspace.net_receives_prefix('core')}/p/f"
    sites.client.create(receive_key, NetReceive(stream_id=STREAM, log=str(sites.received)).to_value())
    sites.client.create(send_key, NetSend(log=str(sites.out), channel=sites.endpoint.format()).to_value())
    # The log does not exist yet (its worker has not started): netd looks for it at every check.
    sites.until(lambda: sites.edge_counters.send_failures == 1 and sites.core_counters.receives == 1,
                "the receive applied, the send waiting for its log")
    sites.write_log()
    sites.until(lambda: sites.edge_counters.sends == 1 and sites.edge_counters.send_failures == 0, "sending")
    sites.until(lambda: sites.image is not None, "the image rebuilt where the NetReceive said")
    messages = [b"m%05d" % i for i in range(2000)]
    sites.send(messages)
    sites.until(lambda: len(sites.got) >= len(messages), "every message received")
    assert sites.got == messages

    # Its key deleted, the log is no longer sent; the receive's deleted, its image ends.
    sites.client.delete(send_key)
    sites.until(lambda: sites.edge_counters.sends == 0 and not sites.sender.publications, "the send stopped")
    sites.client.delete(receive_key)
    sites.until(lambda: sites.core_counters.receives == 0 and not sites.receiver.images(), "the receive stopped")


def test_a_log_written_anew_is_sent_anew(sites):
    sites.client.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                        NetReceive(stream_id=STREAM, log=str(sites.received)).to_value())
    sites.write_log()
    sites.client.create(f"{keyspace.net_sends_prefix('edge')}/p/f@core",
                        NetSend(log=str(sites.out), channel=sites.endpoint.format()).to_value())
    sites.until(lambda: sites.image is not None, "the first image")
    sites.send([b"first"])
    sites.until(lambda: sites.got == [b"first"], "the first writer's message")
    first = sites.sender.publications[0]
    sites.write_log()  # its worker restarted: a new log file at the same path
    sites.until(lambda: sites.sender.publications and sites.sender.publications[0] is not first,
                "the new log sent")
    assert sites.edge_counters.sends == 1


def test_a_key_that_does_not_follow_its_contract_is_counted_and_not_applied(sites):
    sites.client.create(f"{keyspace.net_sends_prefix('edge')}/p/bad", {"log": "/x", "channel": "aeron:udp?mtu=1408"})
    sites.client.create(f"{keyspace.net_receives_prefix('core')}/p/bad", {"stream": 3})
    sites.until(lambda: sites.edge_counters.bad_keys == 1 and sites.core_counters.bad_keys == 1, "both counted")
    assert sites.edge_counters.sends == 0 and sites.core_counters.receives == 0


def test_a_new_sends_log_is_looked_for_often_at_first_then_every_check(sites):
    """A replayer lent to another site creates its log once told to: that site's replay waits for
    it, so netd looks for a new send's log every NEW_LOG_CHECK_INTERVAL_S for NEW_LOG_WAIT_S."""
    sites.client.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                        NetReceive(stream_id=STREAM, log=str(sites.received)).to_value())
    send_key = f"{keyspace.net_sends_prefix('edge')}/p/f@core"
    sites.client.create(send_key, NetSend(log=str(sites.out), channel=sites.endpoint.format()).to_value())
    _until_seen(sites, lambda: sites.edge_counters.send_failures == 1)
    sites.write_log()
    sites.clock.advance(NEW_LOG_CHECK_INTERVAL_S)
    sites.edge.do_work()
    assert sites.edge_counters.sends == 1

    # Another send, whose log stays missing past NEW_LOG_WAIT_S: then looked for every LOG_CHECK_INTERVAL_S.
    other = sites.out.with_name("other.logbuffer")
    sites.client.create(f"{send_key}-2", NetSend(log=str(other), channel=sites.endpoint.format()).to_value())
    _until_seen(sites, lambda: sites.edge_counters.send_failures == 1)
    sites.clock.advance(NEW_LOG_WAIT_S)
    sites.edge.do_work()
    LogBuffer.create(other, LogBufferParams(term_length=65536, session_id=6, stream_id=STREAM)).close()
    sites.clock.advance(NEW_LOG_CHECK_INTERVAL_S)
    sites.edge.do_work()
    assert sites.edge_counters.sends == 1 and sites.edge_counters.send_failures == 1
    sites.clock.advance(LOG_CHECK_INTERVAL_S)
    sites.edge.do_work()
    assert sites.edge_counters.sends == 2 and sites.edge_counters.send_failures == 0


def test_a_log_sent_to_its_end_is_not_sent_again_while_its_key_stays(sites):
    sites.client.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                        NetReceive(stream_id=STREAM, log=str(sites.received)).to_value())
    sites.write_log()
    send_key = f"{keyspace.net_sends_prefix('edge')}/p/f@core"
    send = NetSend(log=str(sites.out), channel=sites.endpoint.format()).to_value()
    sites.client.create(send_key, send)
    sites.until(lambda: sites.image is not None, "the image")
    sites.send([b"only"])
    sites.until(lambda: sites.got == [b"only"], "the message")
    sites.publication.close()  # its end of stream
    sites.until(lambda: sites.edge_counters.sends == 0, "the send ended")
    sites.client.set(send_key, send)  # written again as it was (a choreographer's recompute)
    for _ in range(10):  # each cycle a check
        sites.cycle()
        assert not sites.sender.publications and sites.edge_counters.send_failures == 0
    sites.write_log()  # a new writer: its new log is sent
    sites.until(lambda: sites.edge_counters.sends == 1, "the new log sent")


def _until_seen(sites, condition) -> None:
    """Drive the edge's follower, its clock still, until its watch brought the key and it acted."""
    for _ in range(MAX_CYCLES):
        sites.edge.do_work()
        if condition():
            return
    raise AssertionError("the key never seen")


def test_a_live_streams_send_stopped_and_started_again_holds_its_writer_in_between(sites):
    """The choreographer deletes a live stream's NetSend and writes it again when the receiving
    site's netd restarts: meanwhile its writer, which drops what nobody reads (a live log not
    archived), must see its reader still there, and the stream go on whole."""
    sites.client.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                        NetReceive(stream_id=STREAM, log=str(sites.received)).to_value())
    sites.write_log()
    send_key = f"{keyspace.net_sends_prefix('edge')}/p/f@core"
    send = NetSend(log=str(sites.out), channel=sites.endpoint.format(), tether_hold_s=60.0).to_value()
    sites.client.create(send_key, send)
    sites.until(lambda: sites.image is not None, "the image")
    sites.send([b"before"])
    sites.until(lambda: sites.got == [b"before"], "the first message")

    sites.client.delete(send_key)
    sites.until(lambda: not sites.sender.publications, "the send stopped")
    assert sites.publication.offer(b"meanwhile") > 0  # not NOT_CONNECTED: the stopped send's position holds
    sites.client.create(send_key, send)
    sites.until(lambda: sites.sender.publications, "the send started again")
    sites.send([b"after"])
    sites.until(lambda: len(sites.got) >= 3, "every message received")
    assert sites.got == [b"before", b"meanwhile", b"after"]
    positions = [c for c in sites.counters.counters() if c.type_name == "sub-pos" and "->" in c.label]
    assert len(positions) == 1  # the new send's: the stopped one's was handed over
