"""The built-in server's framing: a 4-byte big-endian length, then one JSON object.

Requests carry an `id` and an `op`; the reply repeats the id with either `ok` (the result) or
`error` (an errors.py code) and `message`. A list result too long for one frame (a large glob,
children or watch) comes as several frames, each within MAX_FRAME_BYTES: `{"id": N, "part": [...]}`
frames, then the `ok` frame with the last items; the client concatenates them. The frames of one
reply are written together, so nothing comes between them. The server also pushes messages without
an id: `{"push": "event", "watch": <id>, "event": {...}}`.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from confserver.errors import BadRequest, ConfError
from confserver.model import MAX_VALUE_BYTES

LENGTH = struct.Struct(">I")
#: A frame holds at most one value plus its envelope; anything longer is refused unread.
MAX_FRAME_BYTES = MAX_VALUE_BYTES + 64 * 1024


def _dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except RecursionError:
        raise BadRequest("message is nested too deeply to encode") from None
    except (TypeError, ValueError) as e:
        raise BadRequest(f"message is not JSON-serialisable: {e}") from None


def frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise BadRequest(f"message of {len(body)} bytes is larger than the {MAX_FRAME_BYTES}-byte limit")
    return LENGTH.pack(len(body)) + body


def encode(message: dict) -> bytes:
    """One frame; BadRequest if the message cannot be encoded or does not fit."""
    return frame(_dumps(message))


def encode_reply(request_id: int | None, result: Any) -> bytes:
    """The frames of a successful reply: one, or for a list too long for one frame, `part` frames
    then the `ok` frame. BadRequest if a single item does not fit a frame."""
    body = _dumps({"id": request_id, "ok": result})
    if len(body) <= MAX_FRAME_BYTES or not isinstance(result, list):
        return frame(body)
    head_part = b'{"id":%s,"part":[' % _dumps(request_id)
    head_ok = b'{"id":%s,"ok":[' % _dumps(request_id)
    budget = MAX_FRAME_BYTES - max(len(head_part), len(head_ok)) - len(b"]}")
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for item in map(_dumps, result):
        if len(item) > budget:
            raise BadRequest(f"an item of {len(item)} bytes is larger than a {MAX_FRAME_BYTES}-byte frame")
        if chunk and size + len(item) + 1 > budget:
            frames.append(frame(head_part + b",".join(chunk) + b"]}"))
            chunk, size = [], 0
        chunk.append(item)
        size += len(item) + 1
    frames.append(frame(head_ok + b",".join(chunk) + b"]}"))
    return b"".join(frames)


def encode_error(request_id: int | None, error: ConfError) -> bytes:
    return encode({"id": request_id, "error": error.code, "message": str(error)})


def _refuse_constant(name: str) -> None:
    raise BadRequest(f"malformed message: {name} is not JSON")


def decode(body: bytes) -> dict:
    """The message in body; BadRequest if it is not a JSON object (NaN and Infinity are not JSON)."""
    try:
        message = json.loads(body, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"malformed message: {e}") from None
    except RecursionError:
        raise BadRequest("malformed message: nested too deeply") from None
    if not isinstance(message, dict):
        raise BadRequest("malformed message: not a JSON object")
    return message
