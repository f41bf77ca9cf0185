"""aeron:udp channel strings parse into one dataclass and format back; a bad one is one line."""

from __future__ import annotations

import pytest

from ramen.transport.udp.channel import Address, ChannelError, UdpChannel, parse

CAPTURED_PUBLICATION = ("aeron:udp?endpoint=127.0.0.1:24325|control=127.0.0.1:24326|term-length=65536|"
                        "session-id=888|init-term-id=0|term-id=0|term-offset=0")


def test_the_captured_publication_channel_parses_and_formats_back():
    channel = parse(CAPTURED_PUBLICATION)
    assert channel == UdpChannel(endpoint=Address("127.0.0.1", 24325), control=Address("127.0.0.1", 24326),
                                 term_length=65536, session_id=888, init_term_id=0, term_id=0, term_offset=0)
    assert channel.has_position
    assert channel.format() == CAPTURED_PUBLICATION
    assert parse(channel.format()) == channel


def test_every_key_and_passed_through_aeron_keys_round_trip():
    text = ("aeron:udp?endpoint=[::1]:40123|mtu=8192|term-length=1073741824|session-id=-5|init-term-id=2147483647|"
            "term-id=-2147483648|term-offset=64|gtag=-9223372036854775808|cc=cubic")
    channel = parse(text)
    assert channel.endpoint == Address("::1", 40123) and str(channel.endpoint) == "[::1]:40123"
    assert channel.gtag == -(1 << 63) and channel.others == (("cc", "cubic"),)
    assert channel.format() == text
    # Term ids wrap as int32: -2**31 is the term after 2**31 - 1 (Aeron's int arithmetic), not before it.
    assert (channel.init_term_id, channel.term_id) == ((1 << 31) - 1, -(1 << 31))


@pytest.mark.parametrize("text, problem", [
    ("aeron:ipc", "not a UDP channel"),
    ("udp://127.0.0.1:1", "not a UDP channel"),
    ("aeron:udp", "needs endpoint= or control="),
    ("aeron:udp?endpoint=127.0.0.1", "is not host:port"),
    ("aeron:udp?endpoint=127.0.0.1:65536", "port 65536 is outside 0..65535"),
    ("aeron:udp?endpoint=127.0.0.1:http", "port 'http' is not a number"),
    ("aeron:udp?endpoint=::1:4000", "is not host:port"),
    ("aeron:udp?endpoint=a:1|endpoint=b:2", "endpoint is given twice"),
    ("aeron:udp?endpoint=a:1|mtuu=1408", "unknown key 'mtuu'"),
    ("aeron:udp?endpoint=a:1|mtu", "'mtu' is not key=value"),
    ("aeron:udp?endpoint=a:1|mtu=1400", "mtu 1400 is not a multiple of 32 in 64..65504"),
    ("aeron:udp?endpoint=a:1|mtu=65536", "mtu 65536 is not a multiple of 32"),
    ("aeron:udp?endpoint=a:1|mtu=32", "mtu 32 is not a multiple of 32 in 64..65504"),
    ("aeron:udp?endpoint=a:1|term-length=100000", "term-length 100000 is not a power of two"),
    ("aeron:udp?endpoint=a:1|term-length=32768", "term-length 32768 is not a power of two in 65536..1073741824"),
    ("aeron:udp?endpoint=a:1|term-length=2147483648", "term-length=2147483648 is outside"),
    ("aeron:udp?endpoint=a:1|session-id=x", "session-id='x' is not an integer"),
    ("aeron:udp?endpoint=a:1|init-term-id=0|term-id=0", "go together (given: init-term-id, term-id)"),
    ("aeron:udp?endpoint=a:1|init-term-id=5|term-id=4|term-offset=0", "term-id 4 is before init-term-id 5"),
    ("aeron:udp?endpoint=a:1|term-length=65536|init-term-id=0|term-id=0|term-offset=65568",
     "term-offset 65568 is not a multiple of 32 within the term"),
    ("aeron:udp?endpoint=a:1|init-term-id=0|term-id=0|term-offset=33", "term-offset 33 is not a multiple of 32"),
    ("aeron:udp?endpoint=a:1|gtag=9223372036854775808", "gtag=9223372036854775808 is outside"),
])
def test_a_bad_channel_is_one_line_naming_the_channel_and_the_problem(text, problem):
    with pytest.raises(ChannelError) as raised:
        parse(text)
    message = str(raised.value)
    assert problem in message, message
    assert message.startswith(f"channel {text!r}: ") and "\n" not in message
