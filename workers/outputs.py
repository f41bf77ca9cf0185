"""A worker's output logs and what flow control holds back for them.

Every output is one ExclusivePublication (one writer per log) and a queue of messages written in
order as the log takes them. A worker has its live log, one replay log shared by the replays it
feeds downstream, and, as a replay's target, the client's recipient log (and its riders'), which
outlive their channel until what is pending for them is written (`closing`).

A live output nobody reads is dropped as Aeron drops it (NOT_CONNECTED), unless the function is
archived: then the worker waits for its recorder. Replay outputs always wait for their reader.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from ramen import paths
from ramen.locks import FileLock
from ramen.message import decode_header
from ramen.rollup import Rollup
from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, CountersFile, ExclusivePublication,
                             LogBuffer, LogBufferError, LogBufferParams)
from ramen.transport.defaults import IPC_MTU_LENGTH, IPC_TERM_LENGTH
from ramen.transport.logbuffer import END_OF_STREAM_UNSET
from ramen.transport.position import int32
from ramen.transport.writer_lock import seal_dead_writer_claims
from ramen.transport.writer_lock import acquire_writer_lock
from ramen.tuples import encode_tuples
from workers.defaults import BATCH_ROWS, MESSAGE_FILL
from workers.errors import WorkerError

log = logging.getLogger(__name__)


def open_output_log(path: Path, session_id: int = 0) -> tuple[LogBuffer, FileLock]:
    """The writer's log buffer and its writer lock: created if absent, else reopened where its tail
    is (a restarted worker continues its log) once the lock is ours (LogBufferBusy while another
    process writes it), with what a dead writer left claimed and uncommitted padded, and the end
    of stream a clean stop left there cleared."""
    path.parent.mkdir(parents=True, exist_ok=True)
    session_id = int32(session_id)
    try:
        buffer = LogBuffer.create(path, LogBufferParams(term_length=IPC_TERM_LENGTH, mtu_length=IPC_MTU_LENGTH,
                                                        session_id=session_id, stream_id=session_id))
    except LogBufferError:
        if not path.exists():
            raise
        buffer = None
    try:
        lock = acquire_writer_lock(path)
    except LogBufferError:
        if buffer is not None:
            buffer.close()
        raise
    if buffer is None:
        try:
            buffer = LogBuffer.open(path)
        except BaseException:
            lock.release()
            raise
        seal_dead_writer_claims(buffer)
        buffer.end_of_stream_position = END_OF_STREAM_UNSET
    return buffer, lock


@dataclass
class Output:
    """One publication and the messages flow control holds back, written in order."""
    name: str
    log: LogBuffer
    publication: ExclusivePublication
    drop_unread: bool = False
    """Drop messages while no reader is connected (a live, non-archived output)."""
    await_recorder: bool = False
    """Hold the first message until the recorder reads the log (an archived live output): any
    other reader (a downstream worker, started sooner) would otherwise let the start go unrecorded."""
    pending: deque = field(default_factory=deque)
    dropped_rows: int = 0
    ended_channel: int | None = None
    """The replay channel whose end this output (a recipient) still flushes, once in `closing`."""

    @classmethod
    def open(cls, path: Path, counters: CountersFile, *, create: bool, session_id: int = 0,
             drop_unread: bool = False, await_recorder: bool = False) -> Output:
        """Our own log (`create`: created or reopened), or a log created for us to write (a replay
        client's); LogBufferBusy if another process writes it."""
        buffer, lock = open_output_log(path, session_id) if create else (LogBuffer.open(path), None)
        try:
            publication = ExclusivePublication(buffer, counters, writer_lock=lock)
        except BaseException:
            buffer.close()
            if lock is not None:
                lock.release()
            raise
        return cls(str(path), buffer, publication, drop_unread, await_recorder)

    def send(self, message: bytes, rows: int = 0, on_sent: Callable[[], None] | None = None) -> None:
        self.pending.append((message, rows, on_sent))

    def flush(self) -> int:
        """Offer what is pending; returns how many messages went out (or were dropped)."""
        done = 0
        if self.await_recorder and self.pending:
            if not self.publication.has_tethered_subscriber:
                return 0
            self.await_recorder = False
        while self.pending:
            message, rows, on_sent = self.pending[0]
            result = self.publication.offer(message)
            if result == ADMIN_ACTION:
                result = self.publication.offer(message)
            if result == NOT_CONNECTED and self.drop_unread:
                self.dropped_rows += rows
            elif result == BACK_PRESSURED or result == NOT_CONNECTED or result == ADMIN_ACTION:
                break
            elif result < 0:
                raise WorkerError(f"{self.name}: cannot write (status {result})")
            self.pending.popleft()
            done += 1
            if on_sent is not None:
                on_sent()
        return done

    def discard(self, channel: int) -> None:
        """Drop the pending messages of a torn-down replay channel: whoever would read them is gone
        with it, and held here they would count against every other channel's flow."""
        kept = deque(p for p in self.pending if (h := decode_header(p[0])) is None or h.channel != channel)
        if len(kept) != len(self.pending):
            log.info("%s: dropped %d messages of torn-down replay %d", self.name, len(self.pending) - len(kept),
                     channel)
            self.pending = kept

    def close(self) -> None:
        self.publication.close()
        self.log.close()


def tuple_messages(table: pa.Table, max_message_length: int, event_time: str | None, channel: int,
                   source: int, rollup: Rollup | None = None) -> Iterator[tuple[bytes, int]]:
    """A table as TUPLES messages of BATCH_ROWS rows, fewer when its rows are so wide that a message
    would pass MESSAGE_FILL of the log's max message length; with the rows of each. With `rollup`,
    each carries the rollup of its rows when that fits (ramen/rollup.py)."""
    max_bytes = int(max_message_length * MESSAGE_FILL)
    rows_per_message = BATCH_ROWS
    if table.nbytes > max_bytes * max(1, table.num_rows // BATCH_ROWS):
        rows_per_message = max(1, int(table.num_rows * max_bytes / max(table.nbytes, 1)))
    for batch in table.combine_chunks().to_batches(max_chunksize=rows_per_message):
        message = encode_tuples(batch, event_time, channel, source)
        if rollup is not None:
            with_rollup = rollup.appended(message, batch)
            if len(with_rollup) <= max_message_length:
                message = with_rollup
        yield message, batch.num_rows


class Outputs:
    """The worker's own logs (live, shared replay log) and the recipients of ended replays that
    still flush; a channel's recipient and riders are its state's (workers/channels.py)."""

    def __init__(self, site: str, qualified_name: str, counters: CountersFile, session_id: int) -> None:
        self.site = site
        self.qualified_name = qualified_name
        self.counters = counters
        self.session_id = session_id
        self.live: Output | None = None
        self.replay: Output | None = None
        self.closing: list[Output] = []

    def open_live(self, *, archived: bool) -> Output:
        self.live = Output.open(paths.output_log(self.site, self.qualified_name), self.counters, create=True,
                                session_id=self.session_id, drop_unread=not archived, await_recorder=archived)
        return self.live

    def open_recipient(self, path: Path) -> Output:
        """A log its reader created for us to write (a replay client's)."""
        return Output.open(path, self.counters, create=False)

    def for_replay(self, recipient: str | None) -> Output:
        """A replay channel's output: the client's log for the target, else the shared replay log."""
        if recipient:
            return self.open_recipient(Path(recipient))
        if self.replay is None:
            self.replay = Output.open(paths.replay_output_log(self.site, self.qualified_name), self.counters,
                                      create=True, session_id=self.session_id)
        return self.replay

    def all(self, recipients: Iterable[Output] = ()) -> list[Output]:
        """Every output, the channels' `recipients` with ours."""
        own = [o for o in (self.live, self.replay) if o is not None]
        return own + list(recipients) + self.closing

    def flush(self, recipients: Iterable[Output]) -> int:
        """Offer what is pending everywhere; close the ended recipients that have written all."""
        work = 0
        for output in self.all(recipients):
            if output.pending:
                work += output.flush()
        if self.closing:
            for output in [o for o in self.closing if not o.pending]:
                output.close()
                self.closing.remove(output)
        return work

    def take_dropped_rows(self) -> int:
        """Live rows dropped (nobody read) since the last call."""
        if self.live is None:
            return 0
        dropped, self.live.dropped_rows = self.live.dropped_rows, 0
        return dropped

    def retire(self, channel: int, outputs: Iterable[Output]) -> None:
        """An ended channel's recipients: closed once what is pending for them is written."""
        for output in outputs:
            output.ended_channel = channel
            self.closing.append(output)

    def tear_down(self, channel: int) -> None:
        """A torn-down replay's messages go: an ended replay's recipient may still hold messages for
        a client that is gone; they can never go, and counted as pending they would hold every input
        back. The shared replay log drops those of the channel too."""
        for output in [o for o in self.closing if o.ended_channel == channel]:
            output.close()
            self.closing.remove(output)
        if self.replay is not None:
            self.replay.discard(channel)

    def close(self, recipients: Iterable[Output]) -> None:
        for output in {id(o): o for o in self.all(recipients)}.values():
            output.close()
        self.closing.clear()
