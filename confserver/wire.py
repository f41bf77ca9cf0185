"""The built-in server's framing: a 4-byte big-endian length, then one JSON object.

Requests carry an `id` and an `op`; the reply repeats the id with either `ok` (the result) or
`error` (an errors.py code) and `message`. The server also pushes messages without an id:
`{"push": "event", "watch": <id>, "event": {...}}`.
"""

from __future__ import annotations

import json
import struct

from confserver.errors import BadRequest
from confserver.model import MAX_VALUE_BYTES

LENGTH = struct.Struct(">I")
#: A frame holds at most one value plus its envelope; anything longer is refused unread.
MAX_FRAME_BYTES = MAX_VALUE_BYTES + 64 * 1024


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise BadRequest(f"message of {len(body)} bytes is larger than the {MAX_FRAME_BYTES}-byte limit")
    return LENGTH.pack(len(body)) + body


def decode(body: bytes) -> dict:
    """The message in body; BadRequest if it is not a JSON object."""
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"malformed message: {e}") from None
    if not isinstance(message, dict):
        raise BadRequest("malformed message: not a JSON object")
    return message
