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


def site_dir(site: str) -> Path:
    return ramen_dir() / "sites" / site


def archive_dir(site: str) -> Path:
    """The archive directory of a site on this host (one archiver per directory)."""
    return site_dir(site) / "archive"


def output_log(site: str, qualified_name: str) -> Path:
    """A worker's live output (channel 0 only): what children read and the archiver records."""
    return site_dir(site) / "logs" / f"{qualified_name}.logbuffer"


def replay_output_log(site: str, qualified_name: str) -> Path:
    """A worker's replay output (replay channels only), never archived."""
    return site_dir(site) / "logs" / f"{qualified_name}.replay.logbuffer"


def replayer_log(site: str, replayer_id: int) -> Path:
    return replayer_logs_dir(site) / f"{replayer_id}.logbuffer"


def replayer_logs_dir(site: str) -> Path:
    return site_dir(site) / "replayers"


def recipient_log(channel: int) -> Path:
    """Where the target of replay `channel` writes its result, for the client that asked."""
    return ramen_dir() / "replays" / f"{channel}.logbuffer"


def logs_dir() -> Path:
    """Where `ramen start` writes the services' logs."""
    return ramen_dir() / "logs"
