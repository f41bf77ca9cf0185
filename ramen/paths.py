"""Where ramen keeps its files on this host."""

import os
from pathlib import Path

RAMEN_DIR_ENV = "RAMEN_DIR"
COUNTERS_FILE_NAME = "counters.dat"


def ramen_dir() -> Path:
    """$RAMEN_DIR, else ~/.local/share/ramen."""
    configured = os.environ.get(RAMEN_DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".local" / "share" / "ramen"


def counters_path() -> Path:
    return ramen_dir() / COUNTERS_FILE_NAME


def archive_dir(site: str) -> Path:
    """The archive directory of a site on this host (one archiver per directory)."""
    return ramen_dir() / "sites" / site / "archive"
