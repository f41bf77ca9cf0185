"""Aeron UDP channel strings: `aeron:udp?endpoint=host:port|control=host:port|mtu=...|...`.

One frozen dataclass both a publication's and a subscription's side parse into and format from, so
a channel written by one process means the same to the other (and to real Aeron: the keys, their
bounds and the rule that init-term-id, term-id and term-offset come together are Aeron's
ChannelUri / UdpChannel / LogBufferDescriptor checks). A bad string raises ChannelError, one line
naming the channel and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass

from ramen.transport.defaults import MAX_UDP_PAYLOAD_LENGTH
from ramen.transport.errors import TransportError
from ramen.transport.frame import FRAME_ALIGNMENT, HEADER_LENGTH
from ramen.transport.logbuffer import TERM_MAX_LENGTH, TERM_MIN_LENGTH, is_power_of_two
from ramen.transport.position import int32

PREFIX = "aeron:udp"
PORT_MAX = 65535
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MTU_MIN_LENGTH = HEADER_LENGTH + FRAME_ALIGNMENT
"""Aeron refuses an MTU not above the 32-byte header; aligned, the smallest is 64."""

ENDPOINT, CONTROL, MTU, TERM_LENGTH, SESSION_ID = "endpoint", "control", "mtu", "term-length", "session-id"
INIT_TERM_ID, TERM_ID, TERM_OFFSET, GTAG = "init-term-id", "term-id", "term-offset", "gtag"
KEYS = (ENDPOINT, CONTROL, MTU, TERM_LENGTH, SESSION_ID, INIT_TERM_ID, TERM_ID, TERM_OFFSET, GTAG)
"""The keys we interpret, in the order format() writes them."""

PASSED_THROUGH = ("alias", "cc", "eos", "interface", "linger", "reliable", "sparse", "tags", "ttl", "rcv-wnd",
                  "so-sndbuf", "so-rcvbuf", "nak-delay")
"""Aeron keys we do not act on yet but keep (and format back), so a channel real Aeron accepts is
not refused for them. Any other key is refused: a misspelt mtu must not pass for a default."""


class ChannelError(TransportError):
    """A channel string that is not a UDP channel we can use; the message is one line."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class UdpChannel:
    """A parsed `aeron:udp?...` channel; None = not given (Aeron's default applies)."""
    endpoint: Address | None = None
    control: Address | None = None
    mtu: int | None = None
    term_length: int | None = None
    session_id: int | None = None
    init_term_id: int | None = None
    term_id: int | None = None
    term_offset: int | None = None
    gtag: int | None = None
    others: tuple[tuple[str, str], ...] = ()
    """PASSED_THROUGH keys, in the order given."""

    @property
    def has_position(self) -> bool:
        """The channel pins where the stream starts (init-term-id, term-id, term-offset)."""
        return self.init_term_id is not None

    def format(self) -> str:
        parts = []
        for key in KEYS:
            value = getattr(self, key.replace("-", "_"))
            if value is not None:
                parts.append(f"{key}={value}")
        parts.extend(f"{key}={value}" for key, value in self.others)
        return f"{PREFIX}?{'|'.join(parts)}" if parts else PREFIX

    __str__ = format


def parse(channel: str) -> UdpChannel:
    """The channel string as a UdpChannel; ChannelError names what is wrong."""
    def fail(problem: str) -> ChannelError:
        return ChannelError(f"channel {channel!r}: {problem}")

    if not isinstance(channel, str):
        raise ChannelError(f"channel {channel!r}: not a string")
    head, _, query = channel.partition("?")
    if head != PREFIX:
        raise fail(f"not a UDP channel (it must start with {PREFIX}?)")
    values: dict[str, object] = {}
    others: list[tuple[str, str]] = []
    for part in query.split("|") if query else ():
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise fail(f"{part!r} is not key=value")
        if key in values or any(key == k for k, _ in others):
            raise fail(f"{key} is given twice")
        if key in PASSED_THROUGH:
            others.append((key, value))
            continue
        if key not in KEYS:
            raise fail(f"unknown key {key!r} (known: {', '.join(KEYS + PASSED_THROUGH)})")
        if key in (ENDPOINT, CONTROL):
            values[key] = _address(value, key, fail)
        elif key == GTAG:
            values[key] = _integer(value, key, INT64_MIN, INT64_MAX, fail)
        else:
            values[key] = _integer(value, key, INT32_MIN if key in (SESSION_ID, INIT_TERM_ID, TERM_ID) else 0,
                                   INT32_MAX, fail)
    if ENDPOINT not in values and CONTROL not in values:
        raise fail("needs endpoint= or control=")
    mtu = values.get(MTU)
    if mtu is not None and (not MTU_MIN_LENGTH <= mtu <= MAX_UDP_PAYLOAD_LENGTH or mtu % FRAME_ALIGNMENT):
        raise fail(f"mtu {mtu} is not a multiple of {FRAME_ALIGNMENT} in {MTU_MIN_LENGTH}..{MAX_UDP_PAYLOAD_LENGTH}")
    term_length = values.get(TERM_LENGTH)
    if term_length is not None and (not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH
                                    or not is_power_of_two(term_length)):
        raise fail(f"term-length {term_length} is not a power of two in {TERM_MIN_LENGTH}..{TERM_MAX_LENGTH}")
    position_keys = [key for key in (INIT_TERM_ID, TERM_ID, TERM_OFFSET) if key in values]
    if position_keys and len(position_keys) != 3:
        raise fail("init-term-id, term-id and term-offset go together (given: " + ", ".join(position_keys) + ")")
    if position_keys:
        term_count = int32(values[TERM_ID] - values[INIT_TERM_ID])  # term ids wrap as int32
        if term_count < 0:
            raise fail(f"term-id {values[TERM_ID]} is before init-term-id {values[INIT_TERM_ID]}")
        offset = values[TERM_OFFSET]
        if offset % FRAME_ALIGNMENT or (term_length is not None and offset > term_length):
            raise fail(f"term-offset {offset} is not a multiple of {FRAME_ALIGNMENT} within the term")
    return UdpChannel(**{key.replace("-", "_"): value for key, value in values.items()}, others=tuple(others))


def _integer(text: str, key: str, low: int, high: int, fail) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise fail(f"{key}={text!r} is not an integer") from None
    if not low <= value <= high:
        raise fail(f"{key}={value} is outside {low}..{high}")
    return value


def _address(text: str, key: str, fail) -> Address:
    if text.startswith("["):  # an IPv6 literal, as Aeron writes it: [::1]:40123
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or ":" in host and not text.startswith("["):
        raise fail(f"{key}={text!r} is not host:port")
    if not (port.isascii() and port.isdigit()):
        raise fail(f"{key}={text!r}: port {port!r} is not a number")
    if int(port) > PORT_MAX:
        raise fail(f"{key}={text!r}: port {port} is outside 0..{PORT_MAX}")
    return Address(host, int(port))
