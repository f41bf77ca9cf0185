"""What every command that talks to the confserver shares: its options, and its errors as one line.

The confserver package is imported only inside these functions, so `ramen` keeps no import-time
dependency on it (DESIGN.md: the CLI reaches services through the confserver client).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from ramen import keyspace, paths
from ramen.cli import argtypes
from ramen.cli.errors import UserError
from ramen.locks import holders

START_HINT = ("is ramen running? start it with `ramen start`, or name its instance with --dir DIR "
              "or its confserver with --confserver URL")
"""What to do when nothing answers: a command finds its confserver through --dir (its instance's
directory), else $RAMEN_CONFSERVER or --confserver."""
#: A person at a terminal would rather hear at once that nothing answers.
CONNECT_TIMEOUT_S = 2.0
RESTART_WAIT_S = 15.0
"""How long a command waits for the confserver of the instance it names (--dir, $RAMEN_DIR) to
answer again while that instance's `ramen start` runs: it restarts a confserver that died, after
0.5 to 10 s of back-off (ramen/cli/keeper.py), and a command asked meanwhile (a dashboard's
script, a cron job) should ride through that rather than fail."""
RETRY_INTERVAL_S = 0.25


def add_arguments(parser, identity: str, *, site: bool = False) -> None:
    parser.add_argument("--confserver", metavar="URL",
                        help="ramen://HOST:PORT (built-in) or zk://HOST:PORT/ROOT (ZooKeeper); "
                             "default $RAMEN_CONFSERVER, else the local embedded server")
    parser.add_argument("--identity",
                        help=f"act as this identity, with its token from the local auth file (default {identity})")
    parser.set_defaults(default_identity=identity)
    parser.add_argument("--token", help="authenticate with this token instead ($RAMEN_CONFSERVER_TOKEN)")
    if site:
        parser.add_argument("--site", default=os.environ.get(keyspace.SITE_ENV) or paths.instance_site()
                            or keyspace.DEFAULT_SITE, type=argtypes.site,
                            help=f"the site (default ${keyspace.SITE_ENV}, else the site the instance of --dir "
                                 f"runs, else {keyspace.DEFAULT_SITE})")


@contextlib.contextmanager
def connected(args) -> Iterator:
    """A confserver client for the command; any confserver error becomes the command's one line.

    An identity asked for with --identity must have a token: from --token, the URL or
    $RAMEN_CONFSERVER_TOKEN, else from the local auth file, which must then know it. Only the
    command's default identity falls back to anonymous where no auth file can be read."""
    import confserver
    explicit = getattr(args, "identity", None) is not None
    identity = args.identity if explicit else getattr(args, "default_identity", None)
    try:
        _, token = confserver.resolve_token(confserver.parse_url(args.confserver), identity, args.token)
        if explicit and token is None:
            raise UserError(f"cannot act as {identity}: the auth file {confserver.default_auth_file()} is missing "
                            f"or unreadable, and no token was given (--token or ${confserver.TOKEN_ENV})")
        with _connect(args, identity, token) as client:
            yield client
    except confserver.Disconnected as e:
        raise UserError(f"{e}; {START_HINT}") from None
    except confserver.ConfError as e:
        raise UserError(str(e)) from None


def _connect(args, identity: str | None, token: str | None):
    import confserver
    waited_since = None
    while True:
        try:
            return confserver.connect(args.confserver, identity=identity, token=token,
                                      connect_timeout_s=CONNECT_TIMEOUT_S)
        except confserver.Disconnected:
            if not _kept_by_its_instance(args):
                raise
            now = time.monotonic()
            if waited_since is None:
                waited_since = now
                print(f"ramen: the confserver of {paths.ramen_dir()} does not answer; its `ramen start` runs "
                      f"(and restarts it): waiting up to {RESTART_WAIT_S:g} s", file=sys.stderr, flush=True)
            elif now - waited_since > RESTART_WAIT_S:
                raise
            time.sleep(RETRY_INTERVAL_S)


def _kept_by_its_instance(args) -> bool:
    """Whether the confserver asked is the one of the instance in --dir/$RAMEN_DIR (no --confserver,
    no $RAMEN_CONFSERVER) and that instance's `ramen start` runs, which restarts it."""
    import confserver
    return (not args.confserver and not os.environ.get(confserver.CONFSERVER_ENV)
            and bool(holders([paths.pid_file()])))


def loaded_programs(client) -> dict:
    """Every program in the confserver, by name."""
    from ramen.program import Program, ProgramError
    programs = {}
    for entry in client.glob(f"{keyspace.PROGRAMS}/*"):
        try:
            programs[entry.key.split("/", 1)[1]] = Program.from_dict(entry.value)
        except ProgramError as e:
            raise UserError(f"{entry.key} in the confserver cannot be read: {e}") from None
    return programs
