"""Tunable defaults of the transport, with their units, in one place."""

DEFAULT_TERM_LENGTH = 16 * 1024 * 1024
DEFAULT_MTU_LENGTH = 1408
DEFAULT_PAGE_SIZE = 4096

SUBSCRIBER_LIVENESS_TIMEOUT_S = 5.0
"""An untethered subscriber whose heartbeat is older than this is dropped by the publication."""

TETHER_HOLD_S = 60.0
"""A tethered subscriber (a recorder) silent this long is dropped too, dead or alive; until then its
writer waits for it, so that a recorder restarted within it (by `ramen start`, whose backoff is
shorter) records on from where the last one stopped and nothing goes unrecorded. A subscriber may
declare another bound in its counter's key (ramen archiver --tether-hold)."""

PUBLICATION_UNBLOCK_TIMEOUT_S = 15.0
"""A frame left uncommitted this long (its writer died mid-message) is turned into padding (Aeron's default)."""

SUBSCRIBER_SCAN_INTERVAL_S = 0.010
"""How often a publication with no known subscriber looks for new ones in the counters file."""

LIMIT_REFRESH_INTERVAL_S = 0.001
"""How often a publication re-reads subscriber positions while it is not at its limit."""

COUNTERS_DEFAULT_CAPACITY = 4096
"""Counters in a new counters file (2.6 MB): four times what one process may hold."""

COUNTERS_PROCESS_SHARE = 0.25
"""The fraction of a counters file's records one process may hold: a process that would take more
(a netd flooded with SETUPs, a leak) is refused its next counter, in its own one-line error, and
never starves the site's other processes of theirs (a flood of 140 SETUPs took all of 1,024 and
the live generator died on its next allocation)."""

COUNTER_FREE_TO_REUSE_DELAY_S = 1.0
"""A freed counter record is not reused before this, so a reader holding its id sees it freed first."""

IDLE_MAX_SPINS = 0
IDLE_MAX_YIELDS = 0
"""An idle duty cycle sleeps at once, neither spinning nor yielding first (Aeron's defaults spin and
yield, for agents with a core each). A ramen host runs more busy processes than it has cores (a
dashboard's refresh: a replayer, a lazy worker, a source's worker folding its rollups, another lazy
worker, httpd), and a reader that caught up with its writer spent on spins and sched_yield() the CPU
the slowest reader needed, which the writer and every other reader then wait for: measured on two
cores, alternating runs, 20 panels at once 1.34-1.39 s with 10 spins and 20 yields, 1.16-1.21 s
without, one panel 0.96-1.01 s either way. A sleep costs IDLE_MIN_PARK_S of latency at most."""
IDLE_MIN_PARK_S = 50e-6
IDLE_MAX_PARK_S = 5e-3

IPC_TERM_LENGTH = 4 * 1024 * 1024
"""Term length of the logs ramen's processes share on one host (Aeron too keeps the IPC term length
apart from the network one). Three terms, 12 MiB, stay in this machine's 32 MiB L3 cache, so a
writer's copies into the log, its cleaning behind the readers, and the readers' copies out of it do
not go to memory; with 16 MiB terms (48 MiB) all of them do. Measured (bench/archive.py, three
alternating runs): a replay session into a log of the recording's term length moves 64 KiB messages
into another process at 5.8-7.6 GB/s with 4 MiB terms, 5.0-6.1 GB/s with 16 MiB; the replayer's CPU
for an hour of traffic is 0.13-0.16 s against 0.18-0.30 s (1-2 MiB terms save it little more, and
their window of half a term would leave a slow reader waiting more often). A message is at most
512 KiB (an eighth of a term); workers cut their batches to fit."""

MAX_UDP_PAYLOAD_LENGTH = 65504
"""Aeron's largest MTU (Configuration.MAX_UDP_PAYLOAD_LENGTH): 64 KiB less IP/UDP headers, aligned."""

IPC_MTU_LENGTH = MAX_UDP_PAYLOAD_LENGTH
"""MTU of the logs ramen's processes share on one host (Aeron's largest): an Arrow batch of a few
thousand rows fits one frame, where 1408-byte frames would cost a Python call per 1.4 KB."""
