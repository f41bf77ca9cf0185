"""The built-in server with a fault injected into its committer's journal writes, for the tests of
what a broken committer does (a real process, as `ramen start` runs it):

    python -m tests.confserver.faulty_server [confserver.server's arguments]

A batch holding the key `boom` makes the write raise (a bug in the committer); one holding `stall`
blocks it forever (a committer stuck on its disk).
"""

import sys
import threading

from confserver import journal, server

_write = journal.Journal.write


def write(self, batch: bytes) -> None:
    if b'"key":"boom"' in batch:
        raise RuntimeError("injected committer failure")
    if b'"key":"stall"' in batch:
        threading.Event().wait()
    _write(self, batch)


journal.Journal.write = write

if __name__ == "__main__":
    sys.exit(server.main())
