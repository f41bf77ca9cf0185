"""ramen.memory: freed message buffers stay in the process, ready for the next messages; start-up
objects are out of the cyclic collector's sight."""

from __future__ import annotations

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
