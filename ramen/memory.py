"""How ramen's processes treat memory: what the C allocator keeps of what they free, and what
Python's cyclic collector looks at."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import resource
from collections.abc import Mapping

log = logging.getLogger(__name__)

TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free memory a process keeps at the top of its heap before giving it back to the system."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter


def retain_freed_memory(threshold_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Keep up to `threshold_bytes` of freed heap instead of returning it to the system at once.

    A process reading a log holds each message (about 100 KB) in a buffer of its own until its
    window commits, then frees it. glibc gives the heap's free top back as soon as it exceeds
    128 KiB, so the next messages' buffers come from fresh pages, each faulted in: measured here,
    2,400 messages of 107 KB cost 0.2 s that way and 0.03 s with the memory kept, which was a
    third of a lazy worker's own time in a replay. Returns whether the allocator took the setting
    (False where the C library is not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt here: freed memory goes back to the system as the C library decides")
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, threshold_bytes))


def freeze_startup_objects() -> int:
    """Move every object alive now (modules, classes, functions: pyarrow's alone are hundreds of
    thousands) out of the cyclic collector's sight, once start-up is over; returns how many.

    A hot loop that allocates containers (a replay's per-message tuples and views) triggers
    collections, and each full one walked all of them again: 0.9% of a lazy replay's CPU in the
    replayer (perf). Start-up objects live as long as the process anyway (gc.freeze, as
    CPython's documentation advises for forking servers)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_on_the_c_allocator(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a process whose pyarrow buffers come from the C library's malloc instead of
    pyarrow's default pool (mimalloc): set before it starts, since pyarrow picks its pool as it is
    imported (pa.set_memory_pool reaches only the Python side, not the C++ kernels).

    For a process of many threads whose peaks are rare (httpd: 144 threads, renders in bursts):
    mimalloc gives each thread a heap of its own and keeps the pages they free, out of reach of a
    collect from another thread. After 200 renders httpd held 745 MB that way, 582 MB of it in
    mimalloc's arena while pyarrow counted 1 MB allocated; on glibc's malloc, 218 MB, 168 MB once
    trimmed (release_unused_memory), from 141 MB before the burst."""
    return {**env, ARROW_POOL_ENV: "system"}


def release_unused_memory() -> None:
    """Give back to the system what the allocators keep of memory freed: pyarrow's pool's (mimalloc
    keeps freed pages for its next allocations) and the top of glibc's heap (malloc_trim).

    For a process whose peaks are rare and far apart (httpd after a burst of renders, on the C
    allocator: 226 -> 168 MB), not for a hot loop, whose next allocations would fault the pages in
    again."""
    import pyarrow as pa  # here for start-up time: every `ramen` command imports this module, few need pyarrow
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def rss_bytes() -> int:
    """This process's resident memory (Linux's /proc), or its peak where there is no /proc."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
