"""What the supervisor did, as counters in the site's counters file (`ramen stat`), read by tests
as attributes and written into `sites/<site>/supervisor/stats` for remote readers."""

from __future__ import annotations

from ramen.transport.service_counters import Count, ServiceCounters


class SupervisorCounters(ServiceCounters, service="supervisor"):
    starts = Count("Worker processes started, restarts included.")
    restarts = Count("Starts of a worker after it crashed.")
    crashes = Count("Worker runs that ended while the worker should run.")
    stops = Count("Worker runs ended because we stopped them (unused, or a new signature).")
    kills = Count("Processes (workers and replayers) that needed SIGKILL after their grace.")
    quarantines = Count("Workers that crashed too often, left stopped for a while.")
    spares = Count("Spare workers started (workers/spare.py); `starts` counts those given a function too.")
    adopted = Count("Processes of an earlier supervisor taken over at start.")
    replays_wired = Count("Replay requests wired: their workers told, or joined to an identical one.")
    replayers_spawned = Count("Replayer processes started.")
    merged_requests = Count("Replay requests that joined another's replayer instead of getting one of their own.")
    replayer_failures = Count("Replayers that ended without ending every channel they served.")
    replay_errors = Count("Errors set on replay keys (the first of each replay).")
    replays_timed_out = Count("Replays torn down after their timeout (their client gone).")
    teardowns = Count("Replays torn down (done, failed or abandoned).")
