"""The addresses services listen on (`--listen HOST:PORT`), for the confserver and httpd alike: a
service beyond loopback must be given credentials, so both ask the same question the same way. And
whether something answers at one (httpd's URL file, the Spark Connect server)."""

from __future__ import annotations

import ipaddress
import socket

DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = ("localhost",)
MAX_PORT = 65535


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` (`:PORT` is the default host, `[::1]:PORT` an IPv6 one);
    ValueError, in one line, else. Port 0 asks for a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > MAX_PORT:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address, as in a URL: [::1]:8080
        host = host[1:-1]
    return host or DEFAULT_HOST, int(port)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def accepts(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts a TCP connection at host:port now (within timeout_s)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
