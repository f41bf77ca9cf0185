"""What netd is asked to do, from the confserver: the site's `net/sends/…` and `net/receives/…` keys
kept applied to the sender and receiver agents.

An agent beside the two of ramen.transport.udp: each do_work drains the watches, then, at once after
a change or every LOG_CHECK_INTERVAL_S, reconciles. A send whose log does not exist yet (its writer
has not started) is tried again at each check, and at first every NEW_LOG_CHECK_INTERVAL_S; so is
one whose log was replaced (another inode: the writer restarted), which is sent anew from its new
writer's position. A log sent to its end of stream is not sent again while its key stays. A key
whose value does not follow its contract is logged and counted, never applied.

A send with a tether hold (a live stream's) that stops while its log goes on (its key deleted or
changed: the receiving netd restarted) keeps its position in the writer's flow control, for the
next send under the same name to take over (SenderAgent.remove_publication's keep_position): the
writer waits meanwhile, for the hold at most, rather than drop what nobody reads.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from confserver.model import EventKind
from ramen import keyspace
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.key_value import ContractError
from ramen.netd.contract import NetReceive, NetSend
from ramen.netd.defaults import LOG_CHECK_INTERVAL_S, NEW_LOG_CHECK_INTERVAL_S, NEW_LOG_WAIT_S
from ramen.transport.errors import TransportError
from ramen.transport.service_counters import Count, ServiceCounters
from ramen.transport.udp.channel import UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import NetworkPublication, SenderAgent

log = logging.getLogger(__name__)


class NetdCounters(ServiceCounters, service="netd"):
    sends = Count("Local logs being sent (a NetSend applied).")
    receives = Count("Streams being received (a NetReceive applied).")
    bad_keys = Count("net/ keys whose value does not follow its contract (logged, not applied).")
    send_failures = Count("NetSends that could not be applied when last tried (log missing or unreadable).")


@dataclass
class _Sending:
    send: NetSend
    publication: NetworkPublication
    inode: int


@dataclass
class _Ended:
    """A log sent to its end of stream, held open: its inode, which tells it from a new log at the
    same path, cannot be reused meanwhile."""
    inode: int
    fd: int

    @classmethod
    def held(cls, path: Path, inode: int) -> "_Ended | None":
        """None if the log is no longer at `path`: whatever is there later is a new log."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_ino != inode:
            os.close(fd)
            return None
        return cls(inode, fd)

    def close(self) -> None:
        os.close(self.fd)


class KeyFollower:
    """Applies the site's net/ keys to `sender` (a SenderAgent) and `receiver` (a ReceiverAgent
    whose endpoint is `endpoint`)."""

    def __init__(self, client, site: str, sender: SenderAgent, receiver: ReceiverAgent, endpoint: UdpChannel,
                 counters: NetdCounters, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.sender = sender
        self.receiver = receiver
        self.endpoint = endpoint
        self.counters = counters
        self._send_prefix = keyspace.net_sends_prefix(site) + "/"
        self._receive_prefix = keyspace.net_receives_prefix(site) + "/"
        self._watches = [client.watch(self._send_prefix + "**"), client.watch(self._receive_prefix + "**")]
        self.wanted_sends: dict[str, NetSend] = {}
        self.wanted_receives: dict[str, NetReceive] = {}
        self.sending: dict[str, _Sending] = {}
        self.receiving: dict[str, NetReceive] = {}
        self._next_check_s = 0.0
        self._waiting_since: dict[str, float] = {}
        """Sends not started yet: since when."""
        self._warned: set[str] = set()
        self._ended: dict[str, _Ended] = {}
        """Sends whose log was sent to its end of stream."""
        self._kept: dict[str, NetworkPublication] = {}
        """Sends stopped while their logs go on, whose positions hold their writers for the next."""

    def do_work(self) -> int:
        work = 0
        for watch in self._watches:
            for event in watch.drain():
                if event.kind != EventKind.SYNCED:
                    work += self._on_event(event)
        now = self._clock.seconds()
        if work or now >= self._next_check_s:
            work += self._reconcile(now)
            new = any(now - since < NEW_LOG_WAIT_S for since in self._waiting_since.values())
            self._next_check_s = now + (NEW_LOG_CHECK_INTERVAL_S if new else LOG_CHECK_INTERVAL_S)
        return work

    def _on_event(self, event) -> int:
        key = event.key
        deleted = event.kind == EventKind.DELETED or event.entry is None
        if key.startswith(self._send_prefix):
            name, kind, wanted = key[len(self._send_prefix):], NetSend, self.wanted_sends
        elif key.startswith(self._receive_prefix):
            name, kind, wanted = key[len(self._receive_prefix):], NetReceive, self.wanted_receives
        else:
            return 0
        before = wanted.pop(name, None)
        if not deleted:
            try:
                wanted[name] = kind.from_value(event.entry.value, key)
            except ContractError as e:
                log.warning("%s; not applied", e)
                self.counters.bad_keys += 1
        if kind is NetSend and wanted.get(name) != before:  # another send: what we knew of the last one goes
            self._forget_ended(name)
            self._waiting_since.pop(name, None)
            self._warned.discard(name)
        return 1

    def _reconcile(self, now: float) -> int:
        changes = 0
        for name, sending in list(self.sending.items()):
            done, wanted = self.sender.is_done(sending.publication), self.wanted_sends.get(name) == sending.send
            if done and wanted and (ended := _Ended.held(Path(sending.send.log), sending.inode)) is not None:
                self._ended[name] = ended
            same_log = _inode(Path(sending.send.log)) == sending.inode
            if done or not wanted or not same_log:
                self._stop_sending(name, keep_position=same_log and not done)
                changes += 1
        for name, receive in list(self.receiving.items()):
            if self.wanted_receives.get(name) != receive:
                self.receiver.remove_subscription(self.endpoint, receive.stream_id)
                del self.receiving[name]
                changes += 1
        for name in sorted(self.wanted_sends.keys() - self.sending.keys()):
            if name in self._ended:
                if _inode(Path(self.wanted_sends[name].log)) == self._ended[name].inode:
                    continue  # sent to its end already
                self._forget_ended(name)
            if self._start_sending(name, self.wanted_sends[name], now):
                self._waiting_since.pop(name, None)
                changes += 1
            else:
                self._waiting_since.setdefault(name, now)
        self.counters.send_failures = len(self._waiting_since)
        for name in sorted(self.wanted_receives.keys() - self.receiving.keys()):
            receive = self.wanted_receives[name]
            self.receiver.add_subscription(self.endpoint, receive.stream_id, image_log=Path(receive.log),
                                           hold_for_readers=receive.readers, window=receive.window or None)
            self.receiving[name] = receive
            log.info("receiving %s: stream %d at %s into %s", name, receive.stream_id, self.endpoint.format(),
                     receive.log)
            changes += 1
        self.counters.sends = len(self.sending)
        self.counters.receives = len(self.receiving)
        return changes

    def _start_sending(self, name: str, send: NetSend, now: float) -> bool:
        """Whether it started; if not, it is tried again at the next check."""
        path = Path(send.log)
        inode = _inode(path)
        if inode is None:
            return False  # its writer has not created it yet
        try:
            tether_hold_ms = None if send.tether_hold_s is None else round(send.tether_hold_s * 1000)
            publication = self.sender.add_publication(path, send.udp_channel, tether_hold_ms=tether_hold_ms,
                                                      succeeding=self._kept.get(name))
        except (TransportError, OSError) as e:
            # A log being created is not whole for a moment: warned of once, if it still is not after a while.
            late = now - self._waiting_since.get(name, now) >= NEW_LOG_WAIT_S and name not in self._warned
            (log.warning if late else log.debug)("%s: cannot send %s: %s", name, path, e)
            if late:
                self._warned.add(name)
            return False
        self._kept.pop(name, None)
        self.sending[name] = _Sending(send, publication, inode)
        log.info("sending %s: %s to %s", name, path, send.channel)
        return True

    def _stop_sending(self, name: str, *, keep_position: bool = False) -> None:
        sending = self.sending.pop(name)
        kept = self.sender.remove_publication(sending.publication, keep_position=keep_position)
        if kept is not None:
            self._kept[name] = kept
        log.info("stopped sending %s (%s)%s", name, sending.send.log,
                 ", its position kept for the next" if kept is not None else "")

    def _forget_ended(self, name: str) -> None:
        if (ended := self._ended.pop(name, None)) is not None:
            ended.close()

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        for name in list(self._ended):
            self._forget_ended(name)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
