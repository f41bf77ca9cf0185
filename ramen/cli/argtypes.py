"""Types of command-line values that must be checked before use: argparse turns their errors into
one line (`ramen tail: error: argument -n/--lines: ...`) and exit 2."""

from __future__ import annotations

import argparse
import ipaddress

from ramen import keyspace


def site(text: str) -> str:
    """A site name, which becomes a directory and a key segment: `--site ../../etc` is refused."""
    try:
        return keyspace.check_site(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def count(text: str) -> int:
    """A whole number >= 0 (how many tuples, lines)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, > 0 and finite (a timeout)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An address or a network (`192.0.2.7`, `10.0.0.0/8`, `::1`): whose datagrams netd takes."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an address or a network (such as 10.0.0.0/8)") from None
