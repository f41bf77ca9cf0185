"""The processes of one ramen instance, found as a user would not need to: by the environment its
processes inherit (RAMEN_DIR), so that tests running side by side never touch each other's."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def processes_with(environ_entry: str, *, below: bool = False) -> dict[int, str]:
    """Running (not zombie) processes whose environment holds `environ_entry` (with `below`, or
    that entry followed by a path below it: `RAMEN_DIR=/a` finds `RAMEN_DIR=/a/b` too, not
    `RAMEN_DIR=/ab`), with their command lines."""
    found = {}
    wanted = environ_entry.encode()
    holds = (lambda entries: any(e == wanted or e.startswith(wanted + b"/") for e in entries)) if below else \
        (lambda entries: wanted in entries)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if not holds(f.read().split(b"\0")):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def kill_left_under(directory: Path) -> dict[int, str]:
    """Kill (-9) every process, but this one, whose RAMEN_DIR lies under `directory`: what tests
    left running there (one that timed out, or failed before its cleanup). Those killed."""
    left = {pid: args for pid, args in processes_with(f"RAMEN_DIR={directory}", below=True).items()
            if pid != os.getpid()}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
