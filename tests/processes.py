"""The processes of one ramen instance, found as a user would not need to: by the environment its
processes inherit (RAMEN_DIR), so that tests running side by side never touch each other's."""

from __future__ import annotations

import os


def processes_with(environ_entry: str) -> dict[int, str]:
    """Running (not zombie) processes whose environment holds `environ_entry`, with their command lines."""
    found = {}
    wanted = environ_entry.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found
