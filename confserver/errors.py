"""One exception type per way a confserver call can fail, shared by every backend.

Callers catch the specific type (a KeyExists on create is an expected race, not a crash); every
message names the key so a CLI can print it as it is. Each type has a stable wire code so the
built-in server can send it and the client can raise the same type.
"""

from __future__ import annotations


class ConfError(Exception):
    """Base of every confserver error."""

    code = "error"


class NoSuchKey(ConfError):
    code = "no_such_key"


class KeyExists(ConfError):
    code = "key_exists"


class VersionMismatch(ConfError):
    code = "version_mismatch"


class LockTimeout(ConfError):
    code = "lock_timeout"


class PermissionDenied(ConfError):
    code = "permission_denied"


class Disconnected(ConfError):
    """The server could not be reached, or the connection dropped while a call was in flight.

    A call that raised this may or may not have been applied, as with ZooKeeper's ConnectionLoss.
    """

    code = "disconnected"


class BadRequest(ConfError):
    """A malformed key, an unserialisable or oversized value, an unknown operation."""

    code = "bad_request"


class SessionExpired(ConfError):
    """The session ended: its ephemeral keys and locks are gone; open a new client."""

    code = "session_expired"


ERRORS_BY_CODE: dict[str, type[ConfError]] = {
    cls.code: cls for cls in (ConfError, NoSuchKey, KeyExists, VersionMismatch, LockTimeout,
                              PermissionDenied, Disconnected, BadRequest, SessionExpired)
}


def error_from_code(code: str, message: str) -> ConfError:
    return ERRORS_BY_CODE.get(code, ConfError)(message)
