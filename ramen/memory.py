"""How ramen's processes treat memory: what the C allocator keeps of what they free, and what
Python's cyclic collector looks at."""

from __future__ import annotations

import ctypes
import gc
import logging

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
