"""A lossy UDP proxy of the tests' own, between a sender agent and a receiver agent on 127.0.0.1.

The sender's channel names the proxy's front socket as its endpoint; the proxy forwards what comes
there to the receiver's endpoint from its back socket, and what the receiver answers back to the
sender from the front socket (so the sender, whose socket is connected to its endpoint, hears it).
Each direction, seeded, drops, duplicates and delays datagrams; delays are counted in the proxy's
duty cycles (do_work calls), never slept, so datagrams sent within a delay of each other may
arrive swapped (reordered). Observers see every datagram as it comes in, before any fault, which
is where the tests check what the sender put on the wire.
"""

from __future__ import annotations

import heapq
import random
import socket
from dataclasses import dataclass, field
from typing import Callable

from ramen.transport.udp.channel import Address

DATAGRAM_MAX_BYTES = 65535


@dataclass
class Faults:
    """What one direction does to datagrams: rates in 0..1, delay in proxy duty cycles."""
    loss: float = 0.0
    duplicate: float = 0.0
    max_delay_cycles: int = 0
    drop_if: Callable[[bytes], bool] | None = None
    """Only datagrams this accepts may be dropped (None: any)."""


@dataclass
class Direction:
    faults: Faults
    observers: list = field(default_factory=list)
    queue: list = field(default_factory=list)
    received: int = 0
    dropped: int = 0
    duplicated: int = 0
    delivered: int = 0


class LossyProxy:
    """Forwards sender <-> receiver through seeded faults; driven by do_work like an agent."""

    def __init__(self, target: Address, *, seed: int, forward: Faults = Faults(), backward: Faults = Faults()) -> None:
        self.target = (target.host, target.port)
        self.rng = random.Random(seed)
        self.front = self._socket()
        self.back = self._socket()
        self.sender_address = None
        """Where the sender's datagrams come from: learned from the first one."""
        self.forward = Direction(forward)
        self.backward = Direction(backward)
        self.cycle = 0
        self._sequence = 0
        self._buffer = bytearray(DATAGRAM_MAX_BYTES)

    @staticmethod
    def _socket() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.bind(("127.0.0.1", 0))
        return sock

    @property
    def address(self) -> Address:
        """The endpoint a sender's channel names: the proxy's front socket."""
        host, port = self.front.getsockname()
        return Address(host, port)

    def inject_to_sender(self, datagram: bytes) -> None:
        """Send bytes to the sender from its endpoint's address (the only address it hears)."""
        if self.sender_address is not None:
            self.front.sendto(datagram, self.sender_address)

    def do_work(self) -> int:
        self.cycle += 1
        work = 0
        work += self._read(self.front, self.forward, remember_sender=True)
        work += self._read(self.back, self.backward)
        work += self._deliver(self.forward, self.back, self.target)
        if self.sender_address is not None:
            work += self._deliver(self.backward, self.front, self.sender_address)
        return work

    def _read(self, sock: socket.socket, direction: Direction, *, remember_sender: bool = False) -> int:
        read = 0
        while True:
            try:
                length, address = sock.recvfrom_into(self._buffer)
            except BlockingIOError:
                return read
            except ConnectionRefusedError:  # the other side's port is closed (a receiver restarting)
                continue
            read += 1
            if remember_sender:
                self.sender_address = address
            datagram = bytes(self._buffer[:length])
            direction.received += 1
            for observe in direction.observers:
                observe(datagram)
            faults = direction.faults
            if faults.loss and (faults.drop_if is None or faults.drop_if(datagram)) \
                    and self.rng.random() < faults.loss:
                direction.dropped += 1
                continue
            copies = 1
            if faults.duplicate and self.rng.random() < faults.duplicate:
                copies = 2
                direction.duplicated += 1
            for _ in range(copies):
                delay = self.rng.randint(0, faults.max_delay_cycles) if faults.max_delay_cycles else 0
                self._sequence += 1
                heapq.heappush(direction.queue, (self.cycle + delay, self._sequence, datagram))

    def _deliver(self, direction: Direction, sock: socket.socket, address) -> int:
        sent = 0
        queue = direction.queue
        while queue and queue[0][0] <= self.cycle:
            datagram = heapq.heappop(queue)[2]
            try:
                sock.sendto(datagram, address)
            except (BlockingIOError, ConnectionRefusedError):
                pass  # lost, as on a network
            direction.delivered += 1
            sent += 1
        return sent

    def close(self) -> None:
        self.front.close()
        self.back.close()
