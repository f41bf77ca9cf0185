"""The supervisor's tunables, in one place, with their units."""

#: How long a new replay waits for others to arrive, so requests of the same data share a replayer.
DELAY_BEFORE_REPLAY_S = 0.5
#: Between SIGTERM and SIGKILL when a process is stopped.
STOP_GRACE_S = 5.0
#: The first restart of a crashed worker waits this long; each further crash doubles it, up to the max.
RESTART_BACKOFF_INITIAL_S = 0.5
RESTART_BACKOFF_FACTOR = 2.0
RESTART_BACKOFF_MAX_S = 30.0
#: A run at least this long proves the worker healthy again: the backoff starts over.
RESTART_BACKOFF_RESET_S = 60.0
#: This many crashes within the window put a worker in quarantine (no restart) for QUARANTINE_S.
QUARANTINE_FAILURES = 5
QUARANTINE_WINDOW_S = 60.0
QUARANTINE_S = 300.0
#: Defunct runs kept per `…/instances/<signature>` key.
MAX_DEFUNCT_RUNS = 10
#: How often the supervisor looks at its children when no event arrives (it does not use SIGCHLD).
POLL_INTERVAL_S = 0.05
#: How often `sites/<site>/supervisor/stats` is written.
STATS_INTERVAL_S = 1.0
LENT_REPLAYER_WINDOW_BYTES = 2 * 1024 * 1024
"""The receiver window of another site's replayer's stream (NetReceive.window; at most half its log's
term): a replay is a bulk transfer, sent a window per round trip of the two netds. At Aeron's 128 KiB
an hour of the demo traffic replayed across sites took 4.2x the local replay, at 2 MiB 1.7-2.0x
(bench/cross_site.py)."""
#: Hands out replayer ids (never 0, never repeated), for every site sharing the confserver: a lent
#: replayer's id is also its stream's, told apart from the others sent to one netd.
REPLAYER_SEQUENCE = "sequences/replayer"

WARM_REPLAYER_WAIT_S = 600.0
"""A warm replayer is started ahead, while no replay runs (or, at the latest, when one is asked, so
that its start-up overlaps the merge delay); it waits this long for the key that gives it its
channels, then exits and another starts: what an orphaned one costs is bounded."""

SPARE_WORKER_SEQUENCE = "sequences/spare_worker"
SPARE_QUIET_S = 2.0
"""A new spare worker starts only once every worker has run this long (and no replay is under way):
its imports take a core for about 0.6 s, which a starting worker or a replay needs more."""
QUIET_AFTER_REPLAYS_S = 1.0
"""Neither a spare worker nor a warm replayer starts before the last replay ended this long ago:
the replays' clients (a dashboard's renders) still work on their results, and on two cores a start-up
right then took a third of a 20-panel refresh's last step."""
LAZY_LINGER_S = 10.0
"""A worker no longer used (a lazy function after its last replay) runs this long before it is
stopped: a dashboard refreshing every few seconds keeps its lazy workers, instead of stopping them
and starting them again, a core for half a second each time."""

RELAY_MAX_BYTES = 16 * 1024 * 1024
"""The most a replay's result relayed through the confserver may weigh (base64, as stored): past
it the relay stops and the replay fails, pointing at a replay from a host of the site. Every byte
goes through the confserver's journal and its watchers: a bigger result belongs in a log buffer."""
RELAY_MAX_BYTES_ENV = "RAMEN_RELAY_MAX_BYTES"
"""Overrides RELAY_MAX_BYTES (bytes) in the supervisor's environment."""
RELAY_POLL_BYTES = 1024 * 1024
"""A relay reads at most about this much of its log per duty cycle, so that one big result does
not hold up the supervisor's other work (at 20 cycles a second, 20 MiB/s)."""
RELAY_KEEP_GRACE_S = 10.0
"""A relayed result nobody deleted goes this long after its request's timeout (by then its client
gave up): a margin for clocks of other hosts."""
