"""The transport's root exception: what a service turns into a one-line error (STYLE.md, section 8).

A transport error is about a file or a peer a user can name: a log buffer or counters file that
cannot be used, a writer already holding a log, frames that are not what a log should hold. A
ValueError from the transport is a caller's mistake (a message longer than the log allows, a key
too long), that is a bug, and gets a traceback.
"""

from __future__ import annotations


class TransportError(Exception):
    """A log buffer, counters file or peer that cannot be used as asked; the message is one line
    naming it."""
