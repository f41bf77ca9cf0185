"""The configuration server: a key tree with versions, watches, locks, ephemeral keys and
permissions, behind one client interface (ConfClient) with two backends, the built-in server
(`ramen://`, the embedded default) and ZooKeeper (`zk://`)."""

from __future__ import annotations

import os
from pathlib import Path

from confserver.client import ConfClient, Lock, Watch
from confserver.errors import (BadRequest, ConfError, Disconnected, KeyExists, LockTimeout, NoSuchKey,
                               PermissionDenied, SessionExpired, VersionMismatch)
from confserver.model import Entry, Event, EventKind
from confserver.url import CONFSERVER_ENV, TOKEN_ENV, ConfServerURL, parse_url

__all__ = ["connect", "ConfClient", "Lock", "Watch", "Entry", "Event", "EventKind", "ConfServerURL",
           "ConfError", "BadRequest", "Disconnected", "KeyExists", "LockTimeout", "NoSuchKey",
           "PermissionDenied", "SessionExpired", "VersionMismatch", "resolve_token", "CONFSERVER_ENV"]

AUTH_FILE_ENV = "RAMEN_CONFSERVER_AUTH"
#: How long a session survives without contact (a dead client's ephemeral keys last this long).
DEFAULT_SESSION_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: How long a service (and a worker or replayer) waits for the confserver as it starts: it has
#: nothing to do without it, and `ramen start` may be restarting it (after a backoff of up to 10 s).
SERVICE_CONNECT_TIMEOUT_S = 30.0


def default_data_dir() -> Path:
    """Where the embedded server keeps its log, snapshots and auth file."""
    from ramen.paths import confserver_dir
    return confserver_dir()


def default_auth_file() -> Path:
    """$RAMEN_CONFSERVER_AUTH, else the auth file of the instance running from $RAMEN_DIR: its own
    confserver's, else the one its `ramen start --confserver` was given."""
    from confserver.auth import AUTH_FILE_NAME
    from ramen.paths import given_auth_file
    configured = os.environ.get(AUTH_FILE_ENV)
    if configured:
        return Path(configured)
    own = default_data_dir() / AUTH_FILE_NAME
    return own if own.exists() else given_auth_file() or own


def resolve_token(url: ConfServerURL, identity: str | None, token: str | None,
                  auth_file: str | os.PathLike | None = None) -> tuple[str | None, str | None]:
    """(identity, token) to authenticate with: an explicit token, else the URL's, else
    $RAMEN_CONFSERVER_TOKEN, else the token of `identity` in the local auth file.

    Without a readable auth file there is no token (the client is anonymous: a host whose file
    this user may not read, or that talks to a remote server). PermissionDenied, naming both, for
    an identity that a readable auth file does not know: a misspelt name must not silently act
    as anonymous."""
    token = token or url.token or os.environ.get(TOKEN_ENV)
    if token or identity is None:
        return identity, token
    from confserver import auth
    path = Path(auth_file) if auth_file else default_auth_file()
    try:
        config = auth.load(path)
    except (BadRequest, PermissionError):
        return identity, None
    token = config.token_of(identity)
    if token is None:
        raise PermissionDenied(f"identity {identity!r} is not in the auth file {path}")
    return identity, token


def connect(url: str | None = None, *, identity: str | None = None, token: str | None = None,
            auth_file: str | os.PathLike | None = None,
            session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
            connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> ConfClient:
    """Open a session with the confserver at url (default: $RAMEN_CONFSERVER, else local).

    Raises Disconnected if it cannot be reached within connect_timeout_s, PermissionDenied for a
    token it does not know."""
    parsed = parse_url(url)
    identity, token = resolve_token(parsed, identity, token, auth_file)
    if parsed.scheme == "zk":
        from confserver.zk import ZkClient
        return ZkClient(parsed, identity=identity, token=token, auth_file=auth_file,
                        session_timeout_s=session_timeout_s, connect_timeout_s=connect_timeout_s)
    from confserver.remote import RemoteClient
    return RemoteClient(parsed, token=token, session_timeout_s=session_timeout_s,
                        connect_timeout_s=connect_timeout_s)
