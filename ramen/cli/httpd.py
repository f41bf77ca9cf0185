"""`ramen httpd`: run the dashboards' HTTP service (ramen/httpd/service.py) until stopped."""

import os
import sys

from ramen.memory import arrow_on_the_c_allocator


def add_parser(sub) -> None:
    parser = sub.add_parser("httpd", add_help=False,
                            description="Serve the Graphite API, /metrics and the dashboard page; "
                                        "`ramen httpd --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    """The service in this process, made anew: its pyarrow must load with the allocator it wants."""
    os.execve(sys.executable, [sys.executable, "-m", "ramen.httpd.service", *args.args],
              arrow_on_the_c_allocator(os.environ))
