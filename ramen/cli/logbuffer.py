"""`ramen logbuffer inspect FILE`: a log buffer's metadata and messages, like Aeron's LogInspector."""

from __future__ import annotations

import base64
import json
import sys

from ramen.cli.errors import UserError
from ramen.transport.logbuffer import LogBuffer, LogBufferError
from ramen.transport.scan import scan_messages

PREVIEW_BYTES = 32
EXIT_DAMAGED = 1
"""A frame of the log was damaged: what could be read is printed, the damage named on stderr."""


def add_parser(sub) -> None:
    parser = sub.add_parser("logbuffer")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    inspect = actions.add_parser("inspect", help="print the metadata and every message still in a log buffer",
                                 description="Print every metadata field (tail counters decoded) and the messages "
                                             "still present, reassembled from their fragments.")
    inspect.add_argument("file", help="a log buffer file (ours or Aeron's)")
    inspect.add_argument("--json", action="store_true",
                         help="one JSON object per line: the metadata, then one per message")
    inspect.set_defaults(run=run_inspect)


def run_inspect(args) -> int:
    try:
        log = LogBuffer.open(args.file, writable=False)
    except LogBufferError as e:
        raise UserError(str(e)) from None
    damaged: list[str] = []
    try:
        metadata = log.metadata_fields()
        messages = scan_messages(log, damaged)
    finally:
        log.close()
    try:
        _print(args, metadata, messages)
    finally:  # after what could be read: the damage is the last word, and the exit status
        for problem in damaged:
            print(f"ramen: logbuffer: {args.file}: damaged frame skipped at {problem}", file=sys.stderr)
    return EXIT_DAMAGED if damaged else 0


def _print(args, metadata: dict, messages: list) -> None:
    out = sys.stdout
    if args.json:
        out.write(json.dumps({"type": "metadata", "file": args.file, **metadata}) + "\n")
        for m in messages:
            out.write(json.dumps({
                "type": "message", "position": m.position, "term_id": m.term_id, "term_offset": m.term_offset,
                "session_id": m.session_id, "stream_id": m.stream_id, "length": len(m.payload),
                "payload_b64": base64.b64encode(m.payload).decode(),
            }) + "\n")
        return
    out.write(f"{args.file}\n")
    for name, value in metadata.items():
        if name == "term_tail_counters":
            for i, tail in enumerate(value):
                out.write(f"  {'tail[' + str(i) + ']':<28} term_id={tail['term_id']} term_offset={tail['term_offset']}"
                          f" (raw {tail['raw']:#x})\n")
        elif name == "default_frame_header":
            out.write(f"  {name:<28} " + " ".join(f"{k}={v}" for k, v in value.items()) + "\n")
        else:
            out.write(f"  {name:<28} {value}\n")
    out.write(f"{len(messages)} messages\n")
    out.write(f"  {'position':>12} {'term_id':>11} {'offset':>8} {'length':>8}  payload\n")
    for m in messages:
        preview = m.payload[:PREVIEW_BYTES]
        text = preview.decode("ascii", "replace") if preview.isascii() else preview.hex()
        more = "…" if len(m.payload) > PREVIEW_BYTES else ""
        out.write(f"  {m.position:>12} {m.term_id:>11} {m.term_offset:>8} {len(m.payload):>8}  {text!r}{more}\n")
