"""A spare worker: a worker process started before anyone needs it, told later which function to be.

    python -m workers.worker --site SITE --spare ID [--parent PID] [--wait-for-key S]

A worker's start-up is mostly Python importing pyarrow, numpy and the program model (about 0.6 s
on these machines; a heavy worker adds about 0.9 s of pyspark's Connect client). A lazy worker
starts when a replay needs it, so that start-up was the first thing every replay of a lazy function
waited for. The supervisor keeps one spare started while nothing else runs; when it needs a worker
it writes the spare's key (`sites/<site>/spares/<id>` = {"function", "log", "spare_log"}) and the
spare goes on as `--function` would have, with its output moved to that function's log. A spare
(like a warm replayer, which waits the same way) exits once the supervisor that started it, its
`--parent`, is gone: the next supervisor starts its own.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from confserver import ConfClient
from ramen import keyspace, service_log
from ramen.spark.defaults import SPARK_REMOTE_ENV

log = logging.getLogger(__name__)

KEY_POLL_S = 0.1
"""How often a process waiting for its key looks at the stop flag and its parent."""


@dataclass(frozen=True)
class Assignment:
    function: str
    log_path: Path | None
    """Where the function's worker logs; None: where the spare did."""
    spare_log_path: Path | None
    """Where the spare logged while it waited: removed once the output has moved."""


def wait_for_assignment(client: ConfClient, site: str, spare_id: int, wait_s: float,
                        stop: threading.Event, parent: int | None = None) -> Assignment | None:
    """The function this spare is to run, once the supervisor says; None after wait_s, a stop, or
    the death of the supervisor that started it (`parent`; a new one starts spares of its own)."""
    entry = wait_for_key(client, keyspace.spare_key(site, spare_id), wait_s, stop, parent)
    if entry is None:
        return None
    value = entry.value if isinstance(entry.value, dict) else {}
    return Assignment(str(value.get("function") or ""), _path(value.get("log")), _path(value.get("spare_log")))


def wait_for_key(client: ConfClient, key: str, wait_s: float, stop: threading.Event | None = None,
                 parent: int | None = None):
    """The key's entry once it exists (a process started ahead waits so for its work); None after
    wait_s, a stop, or once `parent` is no longer our parent (the supervisor that started us died)
    without having written it. Work handed over just before the supervisor died is still done:
    the next supervisor adopts it, and would otherwise wait for a process that quietly left."""
    with client.watch(key) as watch:
        entry = client.get_or_none(key)
        deadline = time.monotonic() + wait_s
        while entry is None and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            if parent is not None and os.getppid() != parent:
                entry = client.get_or_none(key)
                if entry is None:
                    log.info("%s: the supervisor that started us is gone", key)
                return entry
            event = watch.next(KEY_POLL_S)
            if event is not None and event.entry is not None:
                entry = event.entry
    return entry


def _path(value) -> Path | None:
    return Path(value) if value else None


def move_output(assignment: Assignment) -> None:
    """From now on stdout and stderr (where the logging handler writes) append to the function's
    log; the spare's own log, which said only that it waited, goes."""
    if assignment.log_path is None:
        return
    service_log.move_to(assignment.log_path)
    if assignment.spare_log_path is not None:
        assignment.spare_log_path.unlink(missing_ok=True)


def warm_up_arrow(*, pandas: bool = True) -> None:
    """Pay pyarrow's own lazy start-up now, while idle. The first time pyarrow converts Python or
    numpy values (a cast, a comparison with a Python scalar, a to_numpy: what a replay's first
    batch meets in the replayer and in the worker), it imports pandas if pandas is installed
    (pyspark brings it): about 0.45 s on these machines. That import used to land on a replay's
    first batch, once in each process the batch crossed; every worker and replayer now pays it
    at start, which a spare worker or a warm replayer does before it is needed, and a worker
    started for a replay does while the merge delay runs. Likewise pyarrow's first group_by (what
    most user functions do) imports Acero and the dataset module: about 20 ms.

    `pandas=False` (a replayer: it runs no user code) has pyarrow find no pandas instead, so the
    import is never paid: a replayer spawned for a dashboard's batch takes about 0.25 s less CPU
    from the workers of that batch. pyarrow asks once; what needs pandas for real (to_pandas)
    still imports it."""
    started = time.monotonic()
    if pandas:
        pa.array([0])
    else:
        sys.meta_path.insert(0, _NoPandas)
        try:
            pa.array([0])
        finally:
            sys.meta_path.remove(_NoPandas)
    import pyarrow.acero  # noqa: F401 - the import is the point
    log.info("pyarrow warmed up in %.2f s", time.monotonic() - started)


class _NoPandas:
    """An import finder under which pandas cannot be imported (warm_up_arrow)."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is left out of this process")
        return None


def prewarm(client: ConfClient) -> None:
    """Import what a heavy worker needs if this deployment has Spark: paid now, while idle."""
    if client.get_or_none(keyspace.SPARK_SERVER) is None and not os.environ.get(SPARK_REMOTE_ENV):
        return
    started = time.monotonic()
    import pyspark.sql.connect.session  # noqa: F401 - the import is the point
    log.info("pyspark's Connect client imported in %.2f s", time.monotonic() - started)
