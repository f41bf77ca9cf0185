"""The values of netd's keys, one typed definition each (ramen.key_value.KeyValue):

    sites/<site>/net/endpoint          NetEndpoint   written by the site's netd while it runs
    sites/<site>/net/sends/<name>      NetSend       written by whoever wires a stream across sites
    sites/<site>/net/receives/<name>   NetReceive    written by whoever wires a stream across sites

A stream between sites is one NetSend on the sending site, whose channel is the receiving site's
endpoint with the stream's id, and one NetReceive of that stream id on the receiving site. The
name is the wiring's: a function's qualified name for a live stream (the choreographers'), and
`replayer-<id>` for a replayer's log lent to another site's replay (the supervisors':
replayer_stream_name); netd only logs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen.key_value import ContractError, KeyValue
from ramen.transport.udp import channel as udp_channel

__all__ = ["NetEndpoint", "NetReceive", "NetSend", "replayer_stream_name"]


def replayer_stream_name(replayer_id: int) -> str:
    """The net/ key name of a replayer's stream, on both sites: one segment, so never taken for a
    choreographer's (`<prog>/<func>...`)."""
    return f"replayer-{replayer_id}"


def _check_channel(key: str, text: str) -> udp_channel.UdpChannel:
    try:
        parsed = udp_channel.parse(text)
    except udp_channel.ChannelError as e:
        raise ContractError(f"{key}: {e}") from None
    if parsed.endpoint is None:
        raise ContractError(f"{key}: channel {text!r} has no endpoint to send to")
    return parsed


@dataclass(frozen=True)
class NetEndpoint(KeyValue):
    """Where a site's netd receives: its UDP endpoint, as a channel (`aeron:udp?endpoint=host:port`)
    that a NetSend to this site extends with its stream's id; and the netd's pid, for `ramen stat`."""

    KEY: ClassVar[str] = "sites/<site>/net/endpoint"
    channel: str
    pid: int

    def _check(self, key: str) -> None:
        _check_channel(key, self.channel)


@dataclass(frozen=True)
class NetSend(KeyValue):
    """Send the log buffer at `log` (a path on this host, written by an ExclusivePublication) to
    `channel`'s endpoint. The stream is the log's session and stream ids, so the receiving side's
    NetReceive names the same stream id."""

    KEY: ClassVar[str] = "sites/<site>/net/sends/<name>"
    log: str
    channel: str
    tether_hold_s: float | None = None
    """Set, the sender holds the log's writer as a recorder does (a tethered subscriber): while its
    receiver is silent (its netd restarting), or while this send is stopped and started again, the
    writer waits for it this long before going on without it. A live stream's, whose writer would
    otherwise drop what nobody reads. None: Aeron's, not connected after 5 s without a status
    message (a replayer's stream: a replay has its own timeouts, past which it fails in one line)."""

    def _check(self, key: str) -> None:
        _check_channel(key, self.channel)

    @property
    def udp_channel(self) -> udp_channel.UdpChannel:
        return udp_channel.parse(self.channel)


@dataclass(frozen=True)
class NetReceive(KeyValue):
    """Receive stream `stream_id` at this site's endpoint and rebuild it as the log buffer at
    `log` (a path on this host, read by ordinary local subscribers)."""

    KEY: ClassVar[str] = "sites/<site>/net/receives/<name>"
    stream_id: int
    log: str
    readers: int = 0
    """Local readers the stream waits for (its image's consumption held where it joined) before it
    goes on: a replayer's log, whose every reader must see its first message. 0: a live stream,
    which readers join where it is."""
    window: int = 0
    """The stream's receiver window in bytes (Aeron's rcv-wnd, capped at half the log's term):
    how far its sender may run ahead of the slowest reader. 0: Aeron's default, 128 KiB."""
