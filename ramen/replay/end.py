"""Ending a replay, as its target (a worker, or the replayer serving a chart of its source): its
keys deleted once every END_OF_REPLAY is written, which tells its client, and its supervisor, that
it is over."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ramen import keyspace

log = logging.getLogger(__name__)


def end_replays(client, channels: Iterable[int]) -> None:
    """Delete replays/<channel> of each of `channels`, in order (the riders' first, so that nobody
    takes the leader's end for theirs). A key already gone is logged: the client or the supervisor
    may have removed it first."""
    from confserver.errors import ConfError
    for channel in channels:
        try:
            client.delete(keyspace.replay_key(channel))
        except ConfError as e:
            log.info("replays/%d: %s", channel, e)
