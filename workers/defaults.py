"""Tunable defaults of the worker process, with their units, in one place."""

BATCH_ROWS = 4096
"""Rows per TUPLES message a worker writes (sources and function outputs alike): large enough that
the per-message Python cost is small next to the Arrow work, small enough to stay far below the
log's max message length."""

MESSAGE_FILL = 0.5
"""A TUPLES message holds at most this fraction of the log's max message length; bigger batches
are sliced (wide rows, long strings)."""

POLL_BLOCK_LENGTH = 16 * 1024 * 1024
"""Bytes of frames taken from an input log per duty cycle (a term's end stops it sooner): what a
writer has committed, in one go."""

MAX_PENDING_MESSAGES = 64
"""Output messages held back by flow control before the worker stops reading its inputs."""

MAX_CALLS_IN_FLIGHT = 4
"""Calls of a light function submitted to its compute thread and not yet written out; with this
many, the worker reads no more input (workers/compute_thread.py). Each holds one window's rows,
which the worker holds anyway until they are computed."""

COMPUTE_WAIT_S = 0.001
"""With nothing to read while a call runs, the duty cycle waits this long at most for it to
return, then looks at its inputs again."""

LOG_WAIT_INTERVAL_S = 0.05
"""How often a worker looks for a live input's log buffer that does not exist yet (its parent may
not run for a long while)."""

RECEIVED_STALL_S = 30.0
"""A replay's input rebuilt from another site's replayer (workers/inputs.py) that brings nothing new
this long, all it holds read, fails the replay: a replayer reads its archive in milliseconds a
megabyte, so the stream between the two netds is stuck."""

REPLAY_LOG_WAIT_INTERVAL_S = 0.001
"""The same for a replay's input log: its replayer creates it within milliseconds of the replay
key, and every millisecond waited is one the whole replay waits (a stat() costs microseconds).
At the live interval, half the replays of bench/replay.py waited 50 ms for a log that was there."""

STATS_INTERVAL_S = 1.0
"""How often the worker writes its stats key (docs/runtime.md)."""

GENERATOR_FLUSH_INTERVAL_S = 0.2
"""A generator following real time writes what it has at least this often, even below BATCH_ROWS."""

GENERATOR_DEFAULT_RATE = 1000
GENERATOR_DEFAULT_HOSTS = 10
GENERATOR_DEFAULT_SEED = 0
GENERATOR_BYTES_MIN = 40
GENERATOR_BYTES_MAX = 1540
"""Integer fields of generated rows (bytes per packet, say) fall in [MIN, MAX)."""
GENERATOR_INT_RANGE = 1000
"""Integer fields not named like a byte count fall in [0, RANGE)."""

FOLLOW_INTERVAL_S = 0.5
"""How often a file source with follow = true looks for grown and new files."""

EXIT_ERROR = 1
"""Exit status of a worker that cannot run: bad key, bad program, failing callable."""

SPARK_JOB_ROWS = 4_000_000
"""A replay channel of a heavy worker gathers committed windows until they hold this many rows,
then runs them as one Spark job (Spark costs 0.1-0.3 s a job, whatever its size); its last
END_OF_REPLAY runs the rest. A live channel runs its windows as soon as they commit."""

SPARK_STAGED_JOB_ROWS = 32_000_000
"""The same for rows staged on disk for a local Spark (memory holds a file's worth only): an hour
of 10 M tuples is then one job, not three, each of which would read its files apart."""

SPARK_STAGING_FILE_ROWS = 1_000_000
"""Rows per Parquet file a heavy worker stages for a local Spark: each file is a task, so a big
job uses every core."""

SPARK_RETRY_S = (0.5, 1.0, 2.0, 5.0)
"""Waits between attempts at a job while Spark is unreachable (restarting, say); the last repeats.
The job's rows are kept until it succeeds: nothing is lost or computed twice."""

SPARK_REPLAY_UNREACHABLE_S = 120.0
"""How long a replay channel's job waits for an unreachable Spark before its worker fails, naming
why: long enough for `ramen start` to restart a local server (10-20 s cold), short of a replay's
300 s timeout, which would say only that it timed out. A live channel waits for Spark for ever."""

SPARK_HEARTBEAT_S = 0.5
"""While a Spark job runs, the worker heartbeats its inputs this often (their writers drop a reader
silent for 5 s)."""

SPARE_WORKER_WAIT_S = 600.0
"""How long a spare worker waits to be given a function before it exits (the supervisor then
starts another): bounds what an orphaned spare costs if its supervisor died."""
SUMMARY_ROWS = 1 << 20
"""A summarised replay's target folds its rows into buckets every this many rows (and at the end):
its memory stays bounded by them, and the client gets the buckets as they are made."""
SUMMARY_PARTS = 256
"""... or every this many messages: an hour of an archived source's rollups (ramen/rollup.py) is
a few hundred thousand rows in thousands of messages, folded on the way rather than all at the end."""
