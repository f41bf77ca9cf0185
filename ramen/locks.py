"""Exclusive locks on files, held by the kernel for as long as their process lives.

What one process alone may do (write a log buffer, supervise a site) is claimed with an exclusive
flock on a file and kept until release or the end of the process, however it ends: the kernel
drops the lock with its last descriptor, so this truth never outlives its holder, unlike a
confserver key that expires some seconds after its owner. Who holds a lock is read from
/proc/locks; nobody probes a lock by taking it, since a probe holding it for an instant could
refuse its real taker.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")


class LockHeld(Exception):
    """Another live process holds the lock (pid None: it could not be told which)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path}: locked by {f'pid {pid}' if pid else 'another process'}")


class FileLock:
    """An exclusive lock on one file, held until release() or the end of the process."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, path: str | os.PathLike, *, create: bool = False) -> FileLock:
        """Take the lock now, or raise LockHeld naming its holder; FileNotFoundError if the file
        is missing and not `create`."""
        path = Path(path)
        fd = os.open(path, (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(path, holders([path]).get(path)) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the only descriptor of the lock: closing it drops the lock
            self._fd = -1

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holders(paths: Iterable[str | os.PathLike]) -> dict[Path, int]:
    """The pids holding exclusive locks on these files (one read of /proc/locks): path -> pid, for
    the files that are locked. A file that is gone is not locked."""
    wanted: dict[tuple[int, int, int], Path] = {}
    for path in map(Path, paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        wanted[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = path
    if not wanted:
        return {}
    found: dict[Path, int] = {}
    for line in _proc_locks():
        # "1: FLOCK  ADVISORY  WRITE 9309 fe:00:5309338 0 EOF" (a waiter's line reads "1: -> FLOCK ...")
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:
            continue
        path = wanted.get(key)
        if path is not None and pid > 0:
            found[path] = pid
    return found


def _proc_locks() -> list[str]:
    try:
        return PROC_LOCKS.read_text().splitlines()
    except OSError:
        return []
