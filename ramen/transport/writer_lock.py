"""One writer per log buffer, held by the kernel (ramen/locks.py).

The process that writes a log keeps an exclusive lock on the log file for as long as it may write.
Aeron's ExclusivePublication has one writer by construction, its driver handing it out once; here
there is no driver, so the kernel is the arbiter: a second writer is refused before it touches the
log, with an error naming the first one's pid, and which process writes a log (the supervisor
adopts workers by it) is read here, not remembered elsewhere. Readers take no lock.

Holding the lock proves that whoever wrote the log before is gone, so a frame it claimed and never
committed can be padded at once (seal_dead_writer_claims), not after the readers' unblock timeout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ramen.locks import FileLock, LockHeld, holders
from ramen.transport import frame
from ramen.transport.frame_walk import walk
from ramen.transport.image import unblock
from ramen.transport.logbuffer import LogBuffer, LogBufferError, tail_term_offset
from ramen.transport.position import index_by_term_count

log = logging.getLogger(__name__)


class LogBufferBusy(LogBufferError):
    """The log already has a writer, a live process other than the one asking."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path}: already written by {f'pid {pid}' if pid else 'another process'}; "
                         f"a log buffer has one writer")


def acquire_writer_lock(path: str | os.PathLike) -> FileLock:
    """The right to write the log at path, held until released or the end of the process;
    LogBufferBusy if another process has it."""
    try:
        return FileLock.acquire(path)
    except LockHeld as e:
        raise LogBufferBusy(e.path, e.pid) from None
    except FileNotFoundError:
        raise LogBufferError(f"{path}: no such log buffer file") from None


def writer_pids(paths: Iterable[str | os.PathLike]) -> dict[Path, int]:
    """Who writes these logs: path -> pid, for the logs that have a live writer."""
    return holders(paths)


def seal_dead_writer_claims(log_buffer: LogBuffer) -> int:
    """Pad the space an earlier writer of a reopened log claimed in its active term and never
    committed; returns how many bytes. Only for the holder of the log's writer lock, which proves
    that writer gone: its readers then go on at once instead of after their unblock timeout.

    A walk over the active term's frames from its start to the tail, so only for a log whose
    active term holds its stream from offset 0 (a log reopened by its writer; not one created to
    start mid-term, as a replay's is)."""
    index = index_by_term_count(log_buffer.active_term_count)
    term = log_buffer.terms[index]
    term_begin = log_buffer.active_term_count << log_buffer.position_bits_to_shift
    tail = tail_term_offset(log_buffer.raw_tail(index), log_buffer.term_length)
    padded = 0
    offset = walk(term, 0, tail).end
    while offset < tail:
        if frame.INT32.unpack_from(term, offset)[0] > 0 or not unblock(log_buffer, term_begin + offset):
            log.warning("%s: the space at position %d was claimed and not committed, and is not a clean gap: "
                        "left to the readers", log_buffer.path.name, term_begin + offset)
            break
        length = frame.INT32.unpack_from(term, offset)[0]
        padded += frame.align(length)
        log.warning("%s: padded the frame of %d bytes at position %d that the previous writer claimed and never "
                    "committed", log_buffer.path.name, length, term_begin + offset)
        offset = walk(term, offset, tail).end
    return padded
