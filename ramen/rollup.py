"""Rollups: the buckets of a TUPLES message's rows, carried by the message after its record batch.

The worker of an archived function with factors writes, with each live message, its rows' sums and
counts per second and factor values (ramen/replay/summary.py's buckets, one step of
ROLLUP_STEP_S). A summarised replay of the archive (what a dashboard's chart asks) then folds each
message's rollup, tens of rows, rather than its thousands of rows: grouping rows by their factor
values is most of what charting a source costs, and it is paid once, as the rows are written.
Readers of the rows never look past their record batch; a message without a rollup (too big to
fit, written before, or by another version of the function) has its rows folded instead.

Layout, at the header's rollup_offset (ramen/message.py):

    u64 fingerprint | Arrow IPC record batch of the rollup's schema, without the schema

The fingerprint hashes that schema (the step, the factors, the fields and their types): a reader
takes a rollup only when it is the one it would write for the function as it knows it.
"""

from __future__ import annotations

import hashlib
import logging
import struct

import pyarrow as pa

from ramen.message import HEADER_LENGTH, ROLLUP_OFFSET_OFFSET
from ramen.program.model import Function
from ramen.replay import summary
from ramen.replay.contract import Summary

ROLLUP_STEP_S = 1
"""The rollup's bucket: every step a chart asks (a whole number of seconds) is a multiple of it."""
ROLLUP_MAX_SHARE = 0.5
"""A rollup is written only when it is at most this share of its rows' bytes: past it (a factor
with nearly as many values as rows) folding the rollup would save little, and the archive would
grow by as much."""

log = logging.getLogger(__name__)

_FINGERPRINT = struct.Struct("<Q")
_OFFSET = struct.Struct("<I")


class Rollup:
    """The rollup of one function's messages: its buckets' spec and schema, and their fingerprint."""

    def __init__(self, spec: Summary, function: Function) -> None:
        self.spec = spec
        self.function = function
        self.schema = summary.schema(spec, function)
        described = repr((spec.step_s, [(f.name, str(f.type)) for f in self.schema])).encode()
        self.fingerprint = _FINGERPRINT.unpack(hashlib.blake2b(described, digest_size=_FINGERPRINT.size).digest())[0]
        self._prefix = _FINGERPRINT.pack(self.fingerprint)

    @classmethod
    def of(cls, function: Function) -> Rollup | None:
        """The rollup of a function with factors and numbers (what its live messages carry when
        they are archived); None for another."""
        if not function.factors or function.event_time is None:
            return None
        fields = summary.numeric_fields(function)
        if not fields:
            return None
        return cls(Summary(ROLLUP_STEP_S, tuple(function.factors), tuple(fields)), function)

    def appended(self, message: bytes, rows: pa.RecordBatch) -> bytes:
        """A TUPLES message of `rows` with their rollup after them; the message as it was when the
        rollup would not be worth it (ROLLUP_MAX_SHARE of the rows' bytes)."""
        buckets = summary.aggregate(self.spec, self.function, rows).combine_chunks().to_batches()
        if not buckets:
            return message
        rollup = self._prefix + buckets[0].serialize().to_pybytes()
        if len(rollup) > (len(message) - HEADER_LENGTH) * ROLLUP_MAX_SHARE:
            return message
        return (message[:ROLLUP_OFFSET_OFFSET] + _OFFSET.pack(len(message)) + message[ROLLUP_OFFSET_OFFSET + _OFFSET.size:]
                + rollup)

    def decode(self, message) -> pa.RecordBatch | None:
        """The rollup a TUPLES message carries; None when it carries none, another one, or one
        that does not read (its rows are folded then, as those of a message without one)."""
        offset = _OFFSET.unpack_from(message, ROLLUP_OFFSET_OFFSET)[0]
        if offset < HEADER_LENGTH or offset + _FINGERPRINT.size > len(message):
            return None
        return self.decode_tail(pa.py_buffer(message)[offset:])

    def decode_tail(self, tail) -> pa.RecordBatch | None:
        """The rollup in `tail`, a TUPLES message's bytes from its header's rollup_offset on (what
        a replayer copies of a recorded message's frames); None as for `decode`. The batch refers
        to `tail`'s memory, which must outlive it."""
        if len(tail) < _FINGERPRINT.size or _FINGERPRINT.unpack_from(tail, 0)[0] != self.fingerprint:
            return None
        body = pa.py_buffer(tail)[_FINGERPRINT.size:]
        try:
            return pa.ipc.read_record_batch(body, self.schema)
        except (pa.ArrowException, OSError, ValueError) as e:  # what a malformed IPC message raises
            log.warning("%s: a rollup that does not read (%s): its rows are folded instead",
                        self.function.qualified_name, e)
            return None

    def serves(self, wanted: Summary) -> bool:
        """Whether its buckets make those of `wanted`: the same factors, a multiple of its step,
        fields it has."""
        return (self.spec.factors == wanted.factors and wanted.step_s % self.spec.step_s == 0
                and set(wanted.fields) <= set(self.spec.fields))
