"""The archive's root exception: what a service turns into a one-line error (STYLE.md, section 8).

Every archive error names the file it is about (and, for damaged data, the offset in it), so the
one line a user sees says where to look. Anything else raised while reading an archive is a bug.
"""

from __future__ import annotations


class ArchiveError(Exception):
    """An archive that cannot be read as asked: damaged, missing or inconsistent files, or a request
    outside what it holds. The message is one line for the user."""
