"""Where ramen keeps its files on this host."""

import os
from pathlib import Path

from ramen import keyspace

RAMEN_DIR_ENV = "RAMEN_DIR"
COUNTERS_FILE_NAME = "counters.dat"
LOG_SUFFIX = ".logbuffer"
REPLAY_LOG_SUFFIX = ".replay.logbuffer"


def ramen_dir() -> Path:
    """$RAMEN_DIR, else ~/.local/share/ramen."""
    configured = os.environ.get(RAMEN_DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".local" / "share" / "ramen"


CONFSERVER_ADDRESS_FILE_NAME = "address"
"""HOST:PORT, written by the embedded confserver into its data directory once it listens, and
removed when it stops: how a command finds the confserver of the instance its --dir names."""
READY_FILE_NAME = "ready"
"""The confserver URL, written by `ramen start` into DIR/run once it is ready, removed when it stops."""
SITE_FILE_NAME = "site"
PID_FILE_NAME = "ramen.pid"
"""`ramen start`'s pid, in DIR/run, locked for as long as it runs (a stale file is not locked)."""
"""The site `ramen start` runs, in DIR/run while it runs."""
AUTH_FILE_NAME = "confserver-auth"
"""The path of the auth file `ramen start --confserver` was given ($RAMEN_CONFSERVER_AUTH: another
instance's confserver), in DIR/run while it runs."""


def confserver_dir() -> Path:
    """The embedded confserver's data: its journal, snapshots, auth.json and address file."""
    return ramen_dir() / "confserver"


def confserver_address_file() -> Path:
    return confserver_dir() / CONFSERVER_ADDRESS_FILE_NAME


def ready_file() -> Path:
    return ramen_dir() / "run" / READY_FILE_NAME


def pid_file() -> Path:
    return ramen_dir() / "run" / PID_FILE_NAME


def local_confserver_url() -> str | None:
    """The URL of this directory's running instance's confserver, or None: what `ramen start`
    wrote once ready (any confserver it used, a ZooKeeper one included), else where its embedded
    confserver listens (a confserver is up before `ramen start` is ready)."""
    for path, prefix in ((ready_file(), ""), (confserver_address_file(), "ramen://")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return prefix + text
    return None


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees either the old file or the whole new one, never a
    part (a temporary file renamed over it)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def given_auth_file() -> Path | None:
    """The auth file `ramen start --confserver` of this directory's running instance was given (the
    confserver is another instance's), or None: a command given the same --dir gets its tokens
    without $RAMEN_CONFSERVER_AUTH."""
    try:
        return Path((ramen_dir() / "run" / AUTH_FILE_NAME).read_text().strip())
    except OSError:
        return None


def instance_site() -> str | None:
    """The site the instance of this directory runs (`ramen start --site`, kept in run/site while
    it runs), so that a command given its --dir serves that site without --site; None if none runs."""
    try:
        return keyspace.check_site((ramen_dir() / "run" / SITE_FILE_NAME).read_text().strip())
    except (OSError, ValueError):
        return None


def counters_path() -> Path:
    return ramen_dir() / COUNTERS_FILE_NAME


def site_dir(site: str) -> Path:
    return ramen_dir() / "sites" / keyspace.check_site(site)


def archive_dir(site: str) -> Path:
    """The archive directory of a site on this host (one archiver per directory)."""
    return site_dir(site) / "archive"


def output_log(site: str, qualified_name: str) -> Path:
    """A worker's live output (channel 0 only): what children read and the archiver records."""
    return site_dir(site) / "logs" / f"{qualified_name}{LOG_SUFFIX}"


def received_log(site: str, qualified_name: str) -> Path:
    """Another site's function's live output, rebuilt on this host by netd (a NetReceive's log). Apart
    from the output logs, whose writers are this site's workers (a supervisor adopts those)."""
    return site_dir(site) / "received" / f"{qualified_name}{LOG_SUFFIX}"


def parent_log(site: str, qualified_name: str, parent_site: str | None) -> Path:
    """Where a worker of `site` reads the live output of a parent placed on `parent_site` (None: it
    runs on every site, this one too)."""
    return output_log(site, qualified_name) if parent_site in (None, site) else received_log(site, qualified_name)


def output_logs(site: str) -> dict[str, Path]:
    """The live output logs on this host, by qualified function name (replay outputs left out)."""
    logs = site_dir(site) / "logs"
    return {f"{path.parent.name}/{path.name.removesuffix(LOG_SUFFIX)}": path
            for path in sorted(logs.glob(f"*/*{LOG_SUFFIX}")) if not path.name.endswith(REPLAY_LOG_SUFFIX)}


def net_dir(site: str) -> Path:
    """Where netd rebuilds received streams that no NetReceive placed (a sender nobody asked for)."""
    return site_dir(site) / "net"


def supervisor_lock(site: str) -> Path:
    """Held by the one supervisor of a site on this host (ramen/locks.py)."""
    return site_dir(site) / "supervisor.lock"


def replay_output_log(site: str, qualified_name: str) -> Path:
    """A worker's replay output (replay channels only), never archived."""
    return site_dir(site) / "logs" / f"{qualified_name}{REPLAY_LOG_SUFFIX}"


def replayer_log(site: str, replayer_id: int) -> Path:
    return replayer_logs_dir(site) / f"{replayer_id}.logbuffer"


def replayer_logs_dir(site: str) -> Path:
    return site_dir(site) / "replayers"


def received_replayer_log(site: str, replayer_id: int) -> Path:
    """The log of another site's replayer (one lent to a replay of this site), rebuilt here by netd."""
    return received_replayer_logs_dir(site) / f"{replayer_id}.logbuffer"


def received_replayer_logs_dir(site: str) -> Path:
    return site_dir(site) / "received" / "replayers"


def recipient_log(channel: int) -> Path:
    """Where the target of replay `channel` writes its result, for the client that asked."""
    return recipient_logs_dir() / f"{channel}{LOG_SUFFIX}"


def recipient_logs_dir() -> Path:
    return ramen_dir() / "replays"


def logs_dir() -> Path:
    """Where `ramen start` writes the services' logs."""
    return ramen_dir() / "logs"
