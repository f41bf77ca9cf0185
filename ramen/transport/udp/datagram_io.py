"""Batched datagram I/O over a non-blocking UDP socket: many datagrams a system call where Linux
allows it, one a call where it does not, with the same results either way.

Python pays about a microsecond a system call, which at MTU 1408 is most of what a datagram may
cost (issue 23's goal, 300 MB/s, is ~213 k datagrams/s). Linux has two ways of moving many
datagrams in one call, and both keep every datagram's boundaries:

- UDP GSO (`UDP_SEGMENT`, since 4.18): one sendmsg of a buffer the kernel cuts into datagrams of one
  segment size (the last may be shorter), at most MAX_GSO_SEGMENTS of them and at most a UDP
  payload (MAX_GSO_BYTES) in all. The iovec may be many buffers (a sender's slices of its log): the
  kernel gathers them, nothing is joined here.
- UDP GRO (`UDP_GRO`, since 5.0), asked for per socket: one recvmsg may return several datagrams of
  one sender back to back, with their segment size in a control message. On loopback a GSO send
  reaches a GRO socket as it was sent, in one piece; a socket without GRO gets it cut into datagrams.

Both are detected at run time (gso_supported, gro_supported: an old kernel, or another OS, lacks
them) and each call can be told not to use them (gso=False; a socket without enable_gro), which is
the plain path: one sendto / recvmsg_into a datagram. A receiver sees the same datagrams either way.

Every call is non-blocking and returns what it did: send_datagrams how many datagrams went (the
rest are the caller's to send again when the socket is writable; a GSO batch goes whole or not at
all), the receive calls what was there (nothing when the socket is empty). Datagrams are received
into a buffer the caller owns and reuses: the views returned are valid until the next receive into
that buffer.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Callable, Sequence

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
"""setsockopt/cmsg: the GSO segment size of a send (linux/udp.h)."""
UDP_GRO = getattr(socket, "UDP_GRO", 104)
"""setsockopt: deliver coalesced datagrams; cmsg: their segment size (linux/udp.h)."""

MAX_GSO_SEGMENTS = 64
"""Datagrams in one GSO send (the kernel's UDP_MAX_SEGMENTS, 64 before Linux 6.2, 128 after)."""
MAX_UDP_DATAGRAM_BYTES = 65507
"""The largest UDP payload over IPv4 (65535 less the IP and UDP headers)."""
MAX_GSO_BYTES = MAX_UDP_DATAGRAM_BYTES
"""Bytes in one GSO send: its datagrams go out as one UDP packet to the stack, so one payload's worth."""
RECEIVE_SLOT_BYTES = 65536
"""Room a receive needs in the buffer: a datagram, or a GRO batch, is at most 64 KiB."""

_SEGMENT_SIZE = struct.Struct("=H")
"""UDP_SEGMENT's cmsg value: a u16 (the kernel reads it as such)."""
_GRO_SIZE = struct.Struct("=i")
"""UDP_GRO's cmsg value: an int."""
_CMSG_SPACE = socket.CMSG_SPACE(_GRO_SIZE.size)


def _probe(option: int) -> bool:
    """Whether this kernel knows a UDP socket option (getsockopt fails with ENOPROTOOPT if not)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.getsockopt(SOL_UDP, option)
        return True
    except OSError:
        return False


_GSO_SUPPORTED: bool | None = None
_GRO_SUPPORTED: bool | None = None


def gso_supported() -> bool:
    """Whether sends may be segmented by the kernel (UDP_SEGMENT), asked once."""
    global _GSO_SUPPORTED
    if _GSO_SUPPORTED is None:
        _GSO_SUPPORTED = _probe(UDP_SEGMENT)
    return _GSO_SUPPORTED


def gro_supported() -> bool:
    """Whether receives may be coalesced (UDP_GRO), asked once."""
    global _GRO_SUPPORTED
    if _GRO_SUPPORTED is None:
        _GRO_SUPPORTED = _probe(UDP_GRO)
    return _GRO_SUPPORTED


def enable_gro(sock: socket.socket) -> bool:
    """Ask for coalesced receives on sock; whether they are on (False where the kernel lacks them).
    Only receive_datagrams and receive_segments understand what such a socket returns."""
    if not gro_supported():
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def open_socket(address: tuple[str, int], *, buffer_bytes: int | None = None, gro: bool = True) -> socket.socket:
    """A non-blocking UDP socket bound to address (port 0: any), with GRO if asked and supported,
    and the kernel's socket buffers raised to buffer_bytes (capped by net.core.*mem_max)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        sock.bind(address)
        sock.setblocking(False)
        if gro:
            enable_gro(sock)
    except BaseException:
        sock.close()
        raise
    return sock


# -- sending ------------------------------------------------------------------------------------


def send_datagrams(sock: socket.socket, datagrams: Sequence, address: tuple[str, int] | None = None, *,
                   gso: bool = True, on_lost: Callable[[int], None] | None = None) -> int:
    """Send datagrams in order (bytes or memoryviews, each sent as one datagram); how many went.

    Runs of datagrams of one size (the last of a run may be shorter) go as one GSO send each, at
    most MAX_GSO_SEGMENTS datagrams and MAX_GSO_BYTES bytes; the others one sendto each. Fewer than
    len(datagrams) means the socket's buffer is full (EAGAIN, ENOBUFS): the caller sends the rest
    later. `address`: None for a connected socket. `gso`: False forces the plain path.
    `on_lost(count)`: datagrams the network refused (LOST_ERRNOS: an ICMP unreachable reported by a
    connected socket, a firewall) are counted as gone and reported there, as lost on the wire; without
    it, the OSError is raised."""
    count = len(datagrams)
    # Only a UDP socket segments: another datagram socket (AF_UNIX) would send the run as one.
    if gso and count > 1 and sock.family in _UDP_FAMILIES and gso_supported():
        return _send_gso(sock, datagrams, count, address, on_lost)
    return _send_plain(sock, datagrams, 0, count, address, on_lost)


_UDP_FAMILIES = (socket.AF_INET, socket.AF_INET6)

RETRY_ERRNOS = frozenset((errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS))
"""The socket's buffer is full: send the same datagram again later."""
LOST_ERRNOS = frozenset((errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN,
                         errno.ENETDOWN, errno.EPERM, errno.EACCES, errno.EMSGSIZE))
"""The network refused it (nobody listens, no route, a firewall, over the path's size): sending the
same bytes again at once gets no better, so it counts as lost; the protocol repairs or retries."""


def _send_plain(sock: socket.socket, datagrams: Sequence, first: int, stop: int, address,
                on_lost: Callable[[int], None] | None = None) -> int:
    """sendto one a call, datagrams[first:stop]; the index reached (as a count from 0)."""
    send = sock.send if address is None else sock.sendto
    args = () if address is None else (address,)
    i = first
    while i < stop:
        try:
            send(datagrams[i], *args)
        except OSError as error:
            if error.errno in RETRY_ERRNOS:
                break
            if on_lost is None or error.errno not in LOST_ERRNOS:
                raise
            on_lost(1)
        i += 1
    return i


def _send_gso(sock: socket.socket, datagrams: Sequence, count: int, address,
              on_lost: Callable[[int], None] | None = None) -> int:
    i = 0
    sendmsg = sock.sendmsg
    while i < count:
        size = len(datagrams[i])
        # The run: datagrams of this size, then at most one shorter one, within the GSO bounds.
        j = i + 1
        total = size
        limit = min(count, i + MAX_GSO_SEGMENTS)
        while j < limit:
            length = len(datagrams[j])
            if length > size or total + length > MAX_GSO_BYTES:
                break
            total += length
            j += 1
            if length < size:
                break
        if j - i == 1:
            if _send_plain(sock, datagrams, i, i + 1, address, on_lost) == i:
                return i
            i += 1
            continue
        try:
            if address is None:
                sendmsg(datagrams[i:j], [(SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(size))])
            else:
                sendmsg(datagrams[i:j], [(SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(size))], 0, address)
        except OSError as error:
            if error.errno in RETRY_ERRNOS:
                return i
            if on_lost is not None and error.errno in LOST_ERRNOS:
                on_lost(j - i)  # the batch goes whole or not at all
                i = j
                continue
            # EIO/EINVAL: this socket's route cannot segment (no checksum offload, a tunnel): the
            # run goes the plain way, and so does everything after it on this call.
            if error.errno not in (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP):
                raise
            return _send_plain(sock, datagrams, i, count, address, on_lost)
        i = j
    return i


# -- receiving ----------------------------------------------------------------------------------


def receive_segments(sock: socket.socket, buffer: memoryview) -> tuple[int, int, tuple] | None:
    """One receive into buffer: (length, segment_size, address), or None if nothing is waiting.

    The bytes are datagrams of segment_size back to back (the last may be shorter): several when a
    GRO socket got a coalesced batch, else one, and then segment_size is its length. The buffer
    needs RECEIVE_SLOT_BYTES of room."""
    try:
        length, ancillary, _, address = sock.recvmsg_into((buffer,), _CMSG_SPACE)
    except BlockingIOError:
        return None
    segment_size = length
    for level, kind, data in ancillary:
        if level == SOL_UDP and kind == UDP_GRO:
            segment_size = _GRO_SIZE.unpack_from(data)[0]
    return length, segment_size, address


def receive_datagrams(sock: socket.socket, buffer, max_count: int) -> list[tuple[memoryview, tuple]]:
    """Up to max_count datagrams waiting on sock, each as it was sent: (view into buffer, sender).

    Receives go into successive stretches of buffer (each needs RECEIVE_SLOT_BYTES of room) while
    there is room, datagrams waiting and fewer than max_count taken; a GRO batch is cut into its
    datagrams (so it may bring the count past max_count by the rest of that batch). The views are
    valid until buffer is received into again."""
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    out: list[tuple[memoryview, tuple]] = []
    offset = 0
    size = len(view)
    while len(out) < max_count and size - offset >= RECEIVE_SLOT_BYTES:
        got = receive_segments(sock, view[offset:])
        if got is None:
            break
        length, segment_size, address = got
        if segment_size >= length or segment_size <= 0:
            out.append((view[offset:offset + length], address))
        else:
            for start in range(offset, offset + length, segment_size):
                out.append((view[start:min(start + segment_size, offset + length)], address))
        offset += length
    return out


__all__ = ["MAX_GSO_SEGMENTS", "MAX_GSO_BYTES", "RECEIVE_SLOT_BYTES", "enable_gro", "gro_supported",
           "gso_supported", "open_socket", "receive_datagrams", "receive_segments", "send_datagrams"]
