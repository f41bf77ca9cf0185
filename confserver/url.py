"""Which confserver to talk to: `ramen://host:port` (built-in) or `zk://host:port[,...]/root`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from confserver.errors import BadRequest
from ramen.listen import DEFAULT_HOST

CONFSERVER_ENV = "RAMEN_CONFSERVER"
TOKEN_ENV = "RAMEN_CONFSERVER_TOKEN"
DEFAULT_PORT = 29340
ZK_DEFAULT_PORT = 2181
DEFAULT_URL = f"ramen://{DEFAULT_HOST}:{DEFAULT_PORT}"
SCHEMES = ("ramen", "zk")


@dataclass(frozen=True)
class ConfServerURL:
    scheme: str
    hosts: tuple[tuple[str, int], ...]
    root: str = ""
    token: str | None = None

    @property
    def host(self) -> str:
        return self.hosts[0][0]

    @property
    def port(self) -> int:
        return self.hosts[0][1]

    def hosts_string(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.hosts)

    def __str__(self) -> str:
        root = f"/{self.root}" if self.root else ""
        return f"{self.scheme}://{self.hosts_string()}{root}"


def _local_url() -> str | None:
    from ramen.paths import local_confserver_url
    return local_confserver_url()


def parse_url(url: str | None = None) -> ConfServerURL:
    """Parse url, else $RAMEN_CONFSERVER, else the confserver of the ramen running from $RAMEN_DIR
    (the address it wrote there), else the default address."""
    text = url or os.environ.get(CONFSERVER_ENV) or _local_url() or DEFAULT_URL
    parts = urlsplit(text)
    if parts.scheme not in SCHEMES:
        raise BadRequest(f"confserver URL {text!r}: scheme must be ramen:// or zk://")
    netloc = parts.netloc
    token = None
    if "@" in netloc:
        token, _, netloc = netloc.rpartition("@")
    default_port = DEFAULT_PORT if parts.scheme == "ramen" else ZK_DEFAULT_PORT
    hosts = []
    for hostport in filter(None, netloc.split(",")):
        host, sep, port = hostport.rpartition(":")
        if not sep:
            host, port = hostport, str(default_port)
        try:
            hosts.append((host or DEFAULT_HOST, int(port)))
        except ValueError:
            raise BadRequest(f"confserver URL {text!r}: bad port {port!r}") from None
    if not hosts:
        hosts.append((DEFAULT_HOST, default_port))
    if parts.scheme == "ramen" and len(hosts) > 1:
        raise BadRequest(f"confserver URL {text!r}: the built-in server has one address")
    return ConfServerURL(parts.scheme, tuple(hosts), parts.path.strip("/"), token)
