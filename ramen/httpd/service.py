"""`ramen httpd`: run the HTTP service until stopped (`ramen start` runs one, as a service of its own).

It writes its URL to $RAMEN_DIR/run/httpd.url once it listens, and removes it when it stops: how
`ramen start`, the tests and a user find the page. A second httpd of the instance (started by hand)
leaves the file to the first while that one answers. Without --listen, the port the instance's
httpd had last is taken again (run/httpd.last-port: the URL an open tab, a printed line or a
Grafana data source has stays right across a restart, kill -9 or stop and start), else the
default, 29380, when free, else a free one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import urllib.parse
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ramen import keyspace, paths, service_log
from ramen.listen import DEFAULT_HOST, accepts, parse_listen
from ramen.locks import holders
from ramen.httpd import listener
from ramen.httpd.app import make_app
from ramen.httpd.state import Httpd
from ramen.httpd.auth import AuthError, Credentials, check_listen

log = logging.getLogger(__name__)

DEFAULT_PORT = 29380
IDLE_CONNECTION_TIMEOUT_S = 120
"""A connection is closed once it has been this long without a whole request: idle between
requests, or a request's head sent halfway (aiohttp's keepalive_timeout, 3630 s by default, which
let half-sent requests pile up for an hour). Longer than the 90 s Grafana's client keeps an idle
connection, so that it is the one to close it, and never sends a request on one we close."""
CLIENT_ERROR_CHARS = 200
"""Of what aiohttp says of a request it could not read (it quotes the request: 8 KiB of a URL)."""


class ClientErrorsInOneLine(logging.Filter):
    """aiohttp logs a request it cannot read (a URL over 8 KiB, a malformed head) at ERROR with a
    traceback, after answering it 400: the error is the client's, so it is one line at INFO, as a
    user error is everywhere else in ramen (and a client cannot fill the log with tracebacks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and 400 <= error.code < 500:
            reason = " ".join(str(error.message).split())
            record.msg, record.args = "%s: %d %s", (record.getMessage(), error.code, reason[:CLIENT_ERROR_CHARS])
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info = record.exc_text = None
        return True


SERVER_LOG = logging.getLogger("ramen.httpd.server")
"""aiohttp's server logger for our connections (not its own, which other aiohttp users share)."""
SERVER_LOG.addFilter(ClientErrorsInOneLine())
RUNNER_OPTIONS = {"access_log": None, "keepalive_timeout": IDLE_CONNECTION_TIMEOUT_S, "logger": SERVER_LOG}
URL_FILE_NAME = "httpd.url"
LAST_PORT_FILE_NAME = "httpd.last-port"
URL_CHECK_TIMEOUT_S = 1.0
"""How long a connection to the httpd another url file names may take before it is deemed gone."""
IDENTITY = "user"
"""Whom httpd acts as in the confserver: replays are asked as `ramen replay` asks them."""


def url_file() -> Path:
    return paths.ramen_dir() / "run" / URL_FILE_NAME


def last_port_file() -> Path:
    return url_file().with_name(LAST_PORT_FILE_NAME)


def last_port() -> int | None:
    """The port this instance's httpd listened on last (None: none yet)."""
    try:
        return int(last_port_file().read_text())
    except (OSError, ValueError):
        return None


def remember_port(port: int) -> None:
    path = last_port_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(path, f"{port}\n")


def claim_url_file(url: str) -> bool:
    """Write our URL to url_file(), unless it names another httpd that still answers there (the
    instance's own, when a user serves a second one by hand, say beyond loopback for a remote
    Grafana): the file stays the instance's page. Whether we wrote it."""
    path = url_file()
    try:
        theirs = path.read_text().strip()
    except OSError:
        theirs = ""
    if theirs and theirs != url and _answers(theirs):
        log.info("%s names %s, which answers: left as it is", path, theirs)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(path, url + "\n")
    return True


def release_url_file(url: str) -> None:
    """Remove url_file() if it still names us (another httpd may have taken it after we died)."""
    path = url_file()
    try:
        if path.read_text().strip() == url:
            path.unlink()
    except OSError:
        pass


def _answers(url: str) -> bool:
    """Whether something accepts connections at the URL's address."""
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.hostname is not None and accepts(parts.hostname, parts.port, URL_CHECK_TIMEOUT_S)
    except ValueError:  # a port that is not a number: not an httpd's
        return False


def _connect_timeout_s(args: argparse.Namespace) -> float:
    """How long to wait for the confserver: a service's while something may be restarting it (a
    `ramen start` holds its instance, or another confserver was named); else it is not coming, and
    `ramen httpd` run by hand without one fails at once (it took 31 s)."""
    import confserver
    explicit = args.confserver or os.environ.get(confserver.CONFSERVER_ENV)
    if explicit or holders([paths.pid_file()]):
        return confserver.SERVICE_CONNECT_TIMEOUT_S
    return confserver.DEFAULT_CONNECT_TIMEOUT_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", default=None,
                        help=f"address to serve (default {DEFAULT_HOST} on the port this instance's httpd had last, "
                             f"else {DEFAULT_PORT}, else a free port when another ramen holds it; port 0 picks a free "
                             "one)")
    parser.add_argument("--auth", metavar="FILE", type=Path,
                        help="credentials, one a line: `bearer TOKEN` or `basic USER PASSWORD`; required to listen "
                             "beyond loopback")
    parser.add_argument("--confserver", metavar="URL", help="default $RAMEN_CONFSERVER, else the local server")
    parser.add_argument("--site", default=keyspace.default_site(), help="the site whose archives to replay")


async def serve(args: argparse.Namespace, host: str, port: int, stop: asyncio.Event) -> None:
    import confserver
    credentials = Credentials.load(args.auth) if args.auth else None
    check_listen(host, credentials)
    _, token = confserver.resolve_token(confserver.parse_url(args.confserver), IDENTITY, None)
    with confserver.connect(args.confserver, identity=IDENTITY, token=token,
                            connect_timeout_s=_connect_timeout_s(args)) as client:
        httpd = Httpd(client, args.site, credentials=credentials)
        # A render whose client closed its connection is cancelled with its replays: by default
        # aiohttp (since 3.9; its TestServer does cancel) lets a handler run on for nobody, and 200
        # renders' replays went on for 3.5 minutes after their clients had gone.
        runner = web.AppRunner(make_app(httpd), handler_cancellation=True, **RUNNER_OPTIONS)
        await runner.setup()
        try:
            listening = await listener.listen(runner, host, port, httpd.stats, fallback=args.listen is None,
                                              before=last_port())
            address = listening.sockets[0].getsockname()
            url = f"http://{address[0]}:{address[1]}/"
            claimed = claim_url_file(url)
            if claimed:
                remember_port(address[1])
            log.info("httpd of site %s serving %s", args.site, url)
            try:
                await stop.wait()
            finally:
                if claimed:
                    release_url_file(url)
                listening.close()
        finally:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    import confserver
    parser = argparse.ArgumentParser(prog="ramen httpd",
                                     description="Serve the Graphite API (Grafana), /metrics (Prometheus) and the "
                                                 "dashboard page, until stopped.")
    add_arguments(parser)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.INFO)

    try:
        host, port = parse_listen(args.listen or f"{DEFAULT_HOST}:{DEFAULT_PORT}")
    except ValueError as e:
        print(f"ramen: httpd: {e}", file=sys.stderr)
        return 1

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args, host, port, stop)

    try:
        asyncio.run(run())
    except (AuthError, confserver.ConfError) as e:
        print(f"ramen: httpd: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        print(f"ramen: httpd: cannot listen on {args.listen or f'{DEFAULT_HOST}:{DEFAULT_PORT}'}: {reason}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
