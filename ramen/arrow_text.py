"""Text built column-wise by Arrow: the writers of rows (ramen/cli/output.py) and of chart points
(ramen/httpd/render.py) format a whole column in one compute call, then hand its bytes on as they
lie in the string array's data buffer, with no Python step per value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["text_bytes"]


def text_bytes(strings: pa.Array) -> pa.Buffer:
    """The concatenated values of a string array, without a copy: its data buffer's used part."""
    if len(strings) == 0:
        return pa.py_buffer(b"")
    _, offsets, data = strings.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32, count=len(strings) + strings.offset + 1)
    start, end = int(bounds[strings.offset]), int(bounds[strings.offset + len(strings)])
    return data[start:end]
