"""One writer per log buffer, held by the kernel (ramen/locks.py).

The process that writes a log keeps an exclusive lock on the log file for as long as it may write.
Aeron's ExclusivePublication has one writer by construction, its driver handing it out once; here
there is no driver, so the kernel is the arbiter: a second writer is refused before it touches the
log, with an error naming the first one's pid, and which process writes a log (the supervisor
adopts workers by it) is read here, not remembered elsewhere. Readers take no lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ramen.locks import FileLock, LockHeld, holders
from ramen.transport.logbuffer import LogBufferError


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
