"""A service's text log, bounded in size.

Each service process (the confserver, choreographer, supervisor, httpd, netd, a worker, a replayer,
the archiver) logs to one file under DIR/logs that whoever started it opened as its stdout and
stderr, and named in $RAMEN_LOG_FILE. A dashboard's refreshes add about 1 KB of lines a replay
across these files, with no end; so once a file would pass LOG_MAX_BYTES it becomes `<file>.1` (older
copies shift up to `<file>.<LOG_BACKUPS>`, the oldest goes) and the process goes on in a new one.

The process rotates its own file: an outside rotation (logrotate's copytruncate) loses the lines
written between its copy and its truncation. File descriptors 1 and 2 follow the rotation, so a
crash's traceback, and what C libraries and `ramen: ...: ` error lines write there, land in the
current file, where the supervisor reads a dead child's last error.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Mapping
from pathlib import Path

LOG_FILE_ENV = "RAMEN_LOG_FILE"
"""The file a spawner made the process's stdout and stderr; set, the process rotates it."""
LOG_MAX_BYTES = 16 * 1024 * 1024
"""A log file's size before it is rotated: the supervisor's lines of about 28,000 replays (~600 B each)."""
LOG_BACKUPS = 2
"""Rotated copies kept (`<file>.1` the newer): a service's logs take at most 3 x LOG_MAX_BYTES."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STANDARD_FDS = (1, 2)


class RotatingLog(logging.handlers.RotatingFileHandler):
    """Python's rotating handler, with stdout and stderr moved to each new file."""

    def doRollover(self) -> None:
        super().doRollover()
        self.redirect_standard_fds()

    def redirect_standard_fds(self) -> None:
        if self.stream is None:
            self.stream = self._open()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # what Python buffered for the old file goes there, not to the new one
        for fd in STANDARD_FDS:
            os.dup2(self.stream.fileno(), fd)

    def move_to(self, path: Path) -> None:
        """Log to `path` from now on (stdout and stderr too): a spare worker took a function's work."""
        self.acquire()
        try:
            if self.stream is not None:
                self.stream.close()
                self.stream = None
            self.baseFilename = os.path.abspath(path)
            self.redirect_standard_fds()
        finally:
            self.release()


def configure(level: int, *, environ: Mapping[str, str] = os.environ, max_bytes: int = LOG_MAX_BYTES,
              backups: int = LOG_BACKUPS) -> None:
    """The process's logging at `level`: to its $RAMEN_LOG_FILE, rotated, if it has one, else to
    stderr (a service run by hand). As logging.basicConfig, it adds no handler where the root
    logger has one (a service's main called under pytest, whose capture is there)."""
    root = logging.getLogger()
    root.setLevel(level)
    if root.handlers:
        return
    path = environ.get(LOG_FILE_ENV)
    if path and _is_stderr(path):
        handler: logging.Handler = RotatingLog(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)


def _is_stderr(path: str) -> bool:
    """Whether `path` is the file stderr writes to: a process started some other way that
    inherited a service's environment must not write to, let alone rotate, that service's log."""
    try:
        ours, named = os.fstat(STANDARD_FDS[-1]), os.stat(path)
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (named.st_dev, named.st_ino)


def move_to(path: Path) -> None:
    """From now on, the process logs to `path`, its stdout and stderr too (the file is created with
    its folder): a spare worker that took a function's work writes that function's log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotating = [h for h in logging.getLogger().handlers if isinstance(h, RotatingLog)]
    if rotating:
        rotating[0].move_to(path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for standard in STANDARD_FDS:
            os.dup2(fd, standard)
    finally:
        os.close(fd)


def spawn_env(env: Mapping[str, str], log_path: Path) -> dict[str, str]:
    """`env` for a process whose stdout and stderr are `log_path`: it rotates that file itself."""
    return {**env, LOG_FILE_ENV: str(log_path)}
