"""Who may ask: the credentials of `ramen httpd --auth FILE`, checked in constant time.

The file holds one credential per line, `#` comments allowed:

    bearer <token>             # Authorization: Bearer <token>  (Grafana: a custom header)
    basic <user> <password>    # Authorization: Basic ...        (Grafana: basic auth)

httpd refuses a non-loopback address without such a file: dashboards show what the archives hold.
Without one, it answers only requests addressed to a loopback name (`addressed_to_loopback`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path

from ramen.listen import is_loopback


class AuthError(ValueError):
    """An unreadable auth file, or a listen address that needs one; one line for the user."""


@dataclass(frozen=True)
class Credentials:
    tokens: tuple[bytes, ...] = ()
    basic: tuple[tuple[bytes, bytes], ...] = ()

    @classmethod
    def load(cls, path: Path) -> Credentials:
        try:
            text = path.read_text()
        except OSError as e:
            raise AuthError(f"cannot read the auth file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise AuthError(f"the auth file {path} is not text (expected `bearer TOKEN` or `basic USER PASSWORD` "
                            f"lines)") from None
        tokens, basic = [], []
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if words[0] == "bearer" and len(words) == 2:
                tokens.append(words[1].encode())
            elif words[0] == "basic" and len(words) == 3:
                basic.append((words[1].encode(), words[2].encode()))
            else:
                raise AuthError(f"{path}:{number}: expected `bearer TOKEN` or `basic USER PASSWORD`")
        if not tokens and not basic:
            raise AuthError(f"the auth file {path} holds no credential")
        return cls(tuple(tokens), tuple(basic))

    def allows(self, authorization: str | None) -> bool:
        """Whether an Authorization header's value names one of the credentials. Every credential
        is compared, each in constant time, so the time taken says nothing of which came close."""
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip().encode()
        allowed = False
        if scheme.lower() == "bearer":
            for token in self.tokens:
                allowed |= hmac.compare_digest(token, value)
        elif scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            for known_user, known_password in self.basic:
                allowed |= hmac.compare_digest(known_user, user) & hmac.compare_digest(known_password, password)
        return allowed


def check_listen(host: str, credentials: Credentials | None) -> None:
    if credentials is None and not is_loopback(host):
        raise AuthError(f"httpd would listen on {host}, beyond this host, with no credentials: "
                        f"give --auth FILE (see docs/dashboards.md), or listen on 127.0.0.1")


def addressed_to_loopback(host_header: str | None) -> bool:
    """Whether a request's Host names this machine's loopback (127.0.0.1, [::1], localhost), as
    every request to an httpd without credentials must: a web page whose own name its author's DNS
    then points at 127.0.0.1 (DNS rebinding) is, for the browser, of the same origin as what it
    loads from there, and could otherwise read the archives and change the dashboards of anyone
    who visits it. A request without a Host (HTTP/1.0, not a browser's) is answered."""
    if not host_header:
        return True
    if host_header.startswith("["):  # [IPv6]:port
        host = host_header[1:host_header.find("]")]
    else:
        host = host_header.partition(":")[0]
    host = host.rstrip(".").lower()
    return is_loopback(host) or host.endswith(".localhost")  # *.localhost is loopback (RFC 6761)
