"""ramen.memory: freed message buffers stay in the process, ready for the next messages; start-up
objects are out of the cyclic collector's sight."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROGRAM = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "retain":
    from ramen.memory import retain_freed_memory
    assert retain_freed_memory()
messages = [bytearray(100_000) for _ in range(200)]  # 20 MB of message buffers, then freed
del messages
print(libc.mallinfo2().fordblks)
"""


def free_bytes_kept(mode: str) -> int:
    """The free bytes glibc still holds in a fresh process after 20 MB of buffers were freed."""
    result = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True)
    if "mallinfo2" in result.stderr:
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_freed_buffers_stay_in_the_process_instead_of_going_back_to_the_system():
    assert free_bytes_kept("default") < 5_000_000  # glibc trims the heap's free top at once
    assert free_bytes_kept("retain") >= 19_000_000


FREEZE = """
import gc
from ramen.memory import freeze_startup_objects
before = object(), [1, 2]
frozen = freeze_startup_objects()
after = [3, 4]
seen = {id(o) for o in gc.get_objects()}
print(frozen > 0, id(before) in seen, id(after) in seen, gc.get_freeze_count() == frozen)
"""


def test_objects_alive_at_the_end_of_start_up_are_no_longer_walked_by_the_collector():
    result = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "True", "True"]


ARROW_THREADS = """
import threading
import numpy as np, pyarrow as pa
from ramen.memory import release_unused_memory, rss_bytes
THREADS = 16
made, handed, idle = [], threading.Barrier(THREADS + 1), threading.Event()
def fetch():  # a fetch thread: makes a render's tables, hands them over, then idles in its pool
    made.append([pa.table({"v": np.arange(12_500, dtype=np.float64)}).take(np.arange(12_500)) for _ in range(200)])
    handed.wait()
    idle.wait()
before = rss_bytes()
threads = [threading.Thread(target=fetch) for _ in range(THREADS)]
for t in threads: t.start()
handed.wait()
made.clear()  # the renders answered: their tables freed by another thread
release_unused_memory()
print(pa.default_memory_pool().backend_name, (rss_bytes() - before) >> 20)
idle.set()
"""


def kept_after_threads(env: dict) -> tuple[str, int]:
    """pyarrow's pool in a fresh process, and the MB it still holds after 32 threads' tables were freed."""
    result = subprocess.run([sys.executable, "-c", ARROW_THREADS], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    pool, kept_mb = result.stdout.split()
    return pool, int(kept_mb)


def test_a_process_on_the_c_allocator_gives_back_what_its_threads_tables_took():
    """httpd's case (ramen/memory.py): pyarrow's default pool keeps what many threads freed."""
    from ramen.memory import ARROW_POOL_ENV, arrow_on_the_c_allocator
    default = {k: v for k, v in os.environ.items() if k != ARROW_POOL_ENV}
    pool, kept_by_default = kept_after_threads(default)
    on_malloc, kept_on_malloc = kept_after_threads(arrow_on_the_c_allocator(default))
    assert on_malloc == "system" and pool != "system"
    assert kept_on_malloc < kept_by_default
