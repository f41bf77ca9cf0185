"""Where things live in the confserver's key tree: one place, so every service and the CLI agree.

    programs/<prog>                                   a loaded program (Program.to_dict())
    replays/<channel>                                 a replay request (channel: a sequence number)
    replay-results/<channel>/<n>, .../end             a relayed replay's result (the supervisor's;
                                                      not under replays/<channel>, an ephemeral key,
                                                      which in ZooKeeper can have no children)
    tails/<id>                                        a live tail of a function's output (ramen.tails.TailRequest)
    sites/<site>/workers/<prog>/<func>/worker         what the choreographer wants of that worker
    sites/<site>/workers/<prog>/<func>/instance       the running process (ephemeral, the supervisor's)
    sites/<site>/workers/<prog>/<func>/stats          tuples in/out, late, CPU, memory (the worker's)
    sites/<site>/workers/<prog>/<func>/instances/<signature>
                                                      defunct runs: pid, start, exit status, run time
    sites/<site>/workers/<prog>/<func>/replays/<channel>
                                                      how this worker takes part in a replay (supervisor)
    sites/<site>/replayers/<id>                        what a replayer reads and for which channels
    sites/<site>/replayers/<id>/stats                  its bytes read, messages, rows, per channel
    sites/<site>/lent-replayers/<id>                   a replayer another site's replay needs from this
                                                      site's archive (ephemeral, that site's supervisor's)
    sites/<site>/spares/<id>                           the function a spare worker is to run (supervisor)
    sites/<site>/supervisor/stats                      the supervisor's counters and spare processes (ramen.supervisor_stats)
    sites/<site>/supervisor/alive                      the running supervisor (ephemeral: ramen.liveness.SupervisorAlive)
    sites/<site>/archive/coverage                      what the site's archive can replay, per function (archiver)
    sites/<site>/net/endpoint                          where the site's netd receives streams (ephemeral, netd's)
    sites/<site>/net/sends/<name>                      a local log netd is to send over UDP
    sites/<site>/net/receives/<name>                   a stream netd is to receive, and where its image goes
    sequences/replay_channel                          hands out replay channels (never 0: 0 is live)
    spark/server                                      the deployment's Spark Connect endpoint (ramen start)
    spark/wanted                                      a program needs Spark: start the local one (ramen run)
    dashboards/<name>                                 a dashboard of ramen's page (ramen.httpd.dashboards.Dashboard)

The values of a replay's keys (replays/<channel>, …/replays/<channel>, replayers/<id> and its stats)
are defined in ramen/replay/contract.py; those of net/... in ramen/netd/contract.py.
"""

from __future__ import annotations

import os
import re

PROGRAMS = "programs"
REPLAYS = "replays"
REPLAY_RESULTS = "replay-results"
TAILS = "tails"
SITES = "sites"
REPLAY_CHANNEL_SEQUENCE = "sequences/replay_channel"
SPARK_SERVER = "spark/server"
"""{"remote": "sc://host:port", "local": bool, "staging": dir or null}: where heavy workers send
their jobs; `staging` is a directory that server reads too (a local one), for Parquet hand-over."""
SPARK_WANTED = "spark/wanted"
DASHBOARDS = "dashboards"
SITE_ENV = "RAMEN_SITE"
DEFAULT_SITE = "local"


_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def default_site() -> str:
    return os.environ.get(SITE_ENV) or DEFAULT_SITE


def check_site(name: str) -> str:
    """The name, if it can name a site: it becomes a key segment and a directory (ramen/paths.py),
    so letters, digits, '_', '.' and '-', beginning with a letter or digit."""
    if not _SITE_NAME.match(name):
        raise ValueError(f"site {name!r}: a site's name is letters, digits, '_', '.' and '-', "
                         f"beginning with a letter or digit")
    return name


def program_key(name: str) -> str:
    return f"{PROGRAMS}/{name}"


def replay_key(channel: int) -> str:
    return f"{REPLAYS}/{channel}"


def replay_results_key(channel: int) -> str:
    """The root of a relayed replay's result keys (delete_tree it to remove them all)."""
    return f"{REPLAY_RESULTS}/{channel}"


def replay_result_part_key(channel: int, part: int) -> str:
    return f"{replay_results_key(channel)}/{part}"


def replay_result_end_key(channel: int) -> str:
    return f"{replay_results_key(channel)}/end"


def workers_prefix(site: str) -> str:
    return f"{SITES}/{site}/workers"


def function_key(site: str, qualified_name: str, leaf: str) -> str:
    return f"{workers_prefix(site)}/{qualified_name}/{leaf}"


def worker_key(site: str, qualified_name: str) -> str:
    return function_key(site, qualified_name, "worker")


def worker_pattern(site: str) -> str:
    return f"{workers_prefix(site)}/*/*/worker"


def qualified_name_of(key: str) -> str:
    """`prog/func` from any key under sites/<site>/workers/<prog>/<func>/..."""
    parts = key.split("/")
    return f"{parts[3]}/{parts[4]}"


def worker_replay_key(site: str, qualified_name: str, channel: int) -> str:
    return function_key(site, qualified_name, f"replays/{channel}")


def replayers_prefix(site: str) -> str:
    return f"{SITES}/{site}/replayers"


def replayer_key(site: str, replayer_id: int) -> str:
    return f"{replayers_prefix(site)}/{replayer_id}"


def replayer_stats_key(site: str, replayer_id: int) -> str:
    return f"{replayer_key(site, replayer_id)}/stats"


def lent_replayers_prefix(site: str) -> str:
    return f"{SITES}/{site}/lent-replayers"


def lent_replayer_key(site: str, replayer_id: int) -> str:
    return f"{lent_replayers_prefix(site)}/{replayer_id}"


def supervisor_stats_key(site: str) -> str:
    return f"{SITES}/{site}/supervisor/stats"


def supervisor_alive_key(site: str) -> str:
    return f"{SITES}/{site}/supervisor/alive"


def spare_key(site: str, spare_id: int) -> str:
    return f"{SITES}/{site}/spares/{spare_id}"


def archive_coverage_key(site: str) -> str:
    return f"{SITES}/{site}/archive/coverage"


def net_endpoint_key(site: str) -> str:
    return f"{SITES}/{site}/net/endpoint"


def net_sends_prefix(site: str) -> str:
    return f"{SITES}/{site}/net/sends"


def net_receives_prefix(site: str) -> str:
    return f"{SITES}/{site}/net/receives"


def replay_channel_of(key: str) -> int | None:
    """The channel of `replays/<channel>`, None for any other key."""
    prefix, _, rest = key.partition("/")
    if prefix != REPLAYS or not rest.isdigit():
        return None
    return int(rest)
