"""ramen.memory: freed message buffers stay in the process, ready for the next messages."""

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
