"""The agents' UDP sockets, in one place: how they are opened, and what a send or a receive can say.

Every socket is non-blocking (an agent never blocks in do_work), with the buffer sizes of
defaults.py. A sender's socket is connected to its endpoint, as Aeron's unicast send channel is:
it sends with send(), hears only its receiver, and learns from the kernel when nobody listens
there (ICMP port unreachable comes back as ECONNREFUSED on its next send or receive). A receiver's
socket is bound to its endpoint and answers every sender with sendto().

Sends and receives return status codes (STYLE.md, section 2): what the network refuses is an
expected outcome, counted by the agent, never an exception out of do_work.
"""

from __future__ import annotations

import logging
import socket

from ramen.transport.errors import TransportError
from ramen.transport.udp import datagram_io
from ramen.transport.udp.channel import Address
from ramen.transport.udp.defaults import SOCKET_RCVBUF_BYTES, SOCKET_SNDBUF_BYTES

log = logging.getLogger(__name__)

DATAGRAM_MAX_BYTES = datagram_io.RECEIVE_SLOT_BYTES
"""A receive buffer this long holds any UDP datagram whole (a longer one cannot be sent), so a
datagram longer than the MTU is seen at its length and refused, not cut to fit; and any batch of
datagrams GRO coalesces (at most a UDP payload)."""

SENT = 1
"""The whole datagram went to the kernel."""
WOULD_BLOCK = 0
"""EAGAIN/ENOBUFS, or fewer bytes than asked: the datagram was not sent; send it again later."""
UNREACHABLE = -1
"""ECONNREFUSED (an ICMP port unreachable from an earlier send) or a network that refuses the
address: the datagram is lost, as on a lossy network; the protocol repairs or retries."""



class SocketError(TransportError, OSError):
    """A socket that cannot be opened (an address in use, a host that does not resolve): one line,
    naming the socket. Also an OSError with the system's errno and strerror, so a caller that
    handles socket errors handles it."""

    def __init__(self, what: str, error: OSError | socket.gaierror) -> None:
        strerror = error.strerror or str(error)
        super().__init__(error.errno, strerror)
        self.message = f"{what}: {strerror}"

    def __str__(self) -> str:
        return self.message


def _family_and_address(address: Address) -> tuple[int, tuple]:
    try:
        info = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror as error:
        raise SocketError(str(address), error) from None
    return info[0], info[4]


def _new_socket(family: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_RCVBUF_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SNDBUF_BYTES)
    return sock


def open_send_socket(endpoint: Address, control: Address | None = None) -> socket.socket:
    """A sender's socket: bound to `control` if given (else an ephemeral port on the interface the
    kernel routes `endpoint` through) and connected to `endpoint`."""
    family, remote = _family_and_address(endpoint)
    sock = _new_socket(family)
    try:
        if control is not None:
            sock.bind(_family_and_address(control)[1])
        sock.connect(remote)
    except OSError as error:
        sock.close()
        raise SocketError(f"sender socket to {endpoint}{f' from {control}' if control else ''}", error) from None
    return sock


def open_receive_socket(endpoint: Address) -> socket.socket:
    """A receiver's socket, bound to `endpoint`, with coalesced receives where the kernel has them
    (UDP GRO: receive_batch)."""
    family, local = _family_and_address(endpoint)
    sock = _new_socket(family)
    try:
        sock.bind(local)
    except OSError as error:
        sock.close()
        raise SocketError(f"receiver socket on {endpoint}", error) from None
    datagram_io.enable_gro(sock)
    return sock


def send(sock: socket.socket, datagram: bytes, address=None) -> int:
    """Send one datagram (to `address`, or to the connected peer): SENT, WOULD_BLOCK or UNREACHABLE."""
    try:
        sent = sock.send(datagram) if address is None else sock.sendto(datagram, address)
    except OSError as error:
        return _failed(error)
    # UDP sends a datagram whole or not at all; a short count would be a kernel's novelty: retry.
    return SENT if sent == len(datagram) else WOULD_BLOCK


def send_queued(sock: socket.socket, pending, counters) -> int:
    """Send what EAGAIN held back, in order, until the kernel refuses again; how many are done.
    `pending` holds (datagram, address, group): the address None for a connected socket's peer,
    a refusal counted as `group`'s short send (whose datagram waited); a datagram the network
    refused is counted as `counters`' unreachable and gone, as lost on the wire."""
    done = 0
    while pending:
        datagram, address, group = pending[0]
        status = send(sock, datagram, address)
        if status == WOULD_BLOCK:
            group["short-sends"].add(1)
            break
        if status == UNREACHABLE:
            counters["unreachable"].add(1)
        pending.popleft()
        done += 1
    return done


def send_many(sock: socket.socket, datagrams) -> tuple[int, int]:
    """Send datagrams in order to the connected peer, many a system call (UDP GSO) where the kernel
    can: (how many are done, how many of those the network refused). Fewer done than given: the
    socket's buffer is full; send the rest later."""
    lost = [0]

    def on_lost(count: int) -> None:
        lost[0] += count
    done = datagram_io.send_datagrams(sock, datagrams, on_lost=on_lost)
    return done, lost[0]


def receive_batch(sock: socket.socket, buffer: memoryview) -> tuple[int, int, object]:
    """One receive into `buffer` (DATAGRAM_MAX_BYTES long): (length, segment size, sender's address),
    the datagrams back to back in segment-size slices (several when GRO coalesced a sender's batch);
    (0, 0, None) when there is none now, (UNREACHABLE, 0, None) when the kernel reports an earlier
    send refused."""
    try:
        got = datagram_io.receive_segments(sock, buffer)
    except OSError as error:
        return _failed(error), 0, None
    return (0, 0, None) if got is None else got


def receive(sock: socket.socket, buffer: bytearray) -> tuple[int, object]:
    """One datagram into `buffer`: (its length, its sender's address); (0, None) when there is none
    now, (UNREACHABLE, None) when the kernel reports an earlier send refused (nothing was read)."""
    try:
        return sock.recvfrom_into(buffer)
    except OSError as error:
        return _failed(error), None


def _failed(error: OSError) -> int:
    """What a send or receive that raised says: WOULD_BLOCK (nothing moved: again later, 0 as a
    receive's length) or UNREACHABLE (datagram_io.LOST_ERRNOS); any other error is raised."""
    if error.errno in datagram_io.RETRY_ERRNOS:
        return WOULD_BLOCK
    if error.errno in datagram_io.LOST_ERRNOS:
        return UNREACHABLE
    raise error


def local_address(sock: socket.socket) -> Address:
    host, port = sock.getsockname()[:2]
    return Address(host, port)


__all__ = ["SENT", "WOULD_BLOCK", "UNREACHABLE", "SocketError", "open_send_socket", "open_receive_socket", "send",
           "send_many", "send_queued", "receive", "receive_batch", "local_address"]
