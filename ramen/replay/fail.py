"""Failing a replay from any process on its path (a supervisor, a replayer, a worker): its `error`,
set once."""

from __future__ import annotations

from ramen import keyspace
from ramen.replay.contract import error_of, with_error


def fail_replay(client, channel: int, message: str, *, lost: bool = False) -> bool:
    """Put `message` into replays/<channel> unless an error is there already (the first one
    stays): its client prints it and exits at once; `lost`: a process on its path died under it.
    Whether it was written: a key gone or changed meanwhile is left (whoever changed it will say).
    Any other confserver error (a lost connection) is the caller's: a supervisor's loop
    reconnects, a dying process logs it."""
    from confserver.errors import NoSuchKey, VersionMismatch
    key = keyspace.replay_key(channel)
    try:
        entry = client.get_or_none(key)
        if entry is None or error_of(entry.value):
            return False
        client.update(key, with_error(entry.value, message, lost=lost), version=entry.version)
        return True
    except (NoSuchKey, VersionMismatch):
        return False
