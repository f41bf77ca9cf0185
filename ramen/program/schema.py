"""Arrow types by the names users write in program files ("int64", "timestamp[us]", "list<string>"),
and schemas as ordered (field, type name) pairs: the form stored in the confserver and shown by
`ramen compile`, readable by people and exact enough to rebuild the pyarrow.Schema."""

from __future__ import annotations

import re

import pyarrow as pa

SIMPLE_TYPES: dict[str, pa.DataType] = {
    "null": pa.null(), "bool": pa.bool_(),
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(),
    "string": pa.string(), "large_string": pa.large_string(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date64": pa.date64(),
}
ALIASES = {"boolean": "bool", "utf8": "string", "large_utf8": "large_string", "halffloat": "float16",
           "float": "float32", "double": "float64", "date32[day]": "date32", "date64[ms]": "date64"}
"""Arrow's own spellings (str(pa.float64()) is "double"), accepted on input, never written."""
TIME_UNITS = ("s", "ms", "us", "ns")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]$")
_DURATION = re.compile(r"duration\[(s|ms|us|ns)\]$")
_TIME32 = re.compile(r"time32\[(s|ms)\]$")
_TIME64 = re.compile(r"time64\[(us|ns)\]$")
_DECIMAL = re.compile(r"decimal128\((\d+),\s*(-?\d+)\)$")
_LIST = re.compile(r"list<(.+)>$")
_NAMES = {t: name for name, t in SIMPLE_TYPES.items()}
TYPE_HELP = ("int8..int64, uint8..uint64, float16/32/64, bool, string, binary, date32, date64, "
             "timestamp[s|ms|us|ns], duration[unit], time32[s|ms], time64[us|ns], decimal128(p, s), list<type>")


def parse_type(name: str) -> pa.DataType:
    """The Arrow type called `name`; ValueError naming the allowed types otherwise."""
    text = name.strip() if isinstance(name, str) else ""
    text = ALIASES.get(text, text)
    if text in SIMPLE_TYPES:
        return SIMPLE_TYPES[text]
    if match := _TIMESTAMP.match(text):
        return pa.timestamp(match.group(1), tz=match.group(2).strip() if match.group(2) else None)
    if match := _DURATION.match(text):
        return pa.duration(match.group(1))
    if match := _TIME32.match(text):
        return pa.time32(match.group(1))
    if match := _TIME64.match(text):
        return pa.time64(match.group(1))
    if match := _DECIMAL.match(text):
        precision, scale = int(match.group(1)), int(match.group(2))
        if 1 <= precision <= 38:
            return pa.decimal128(precision, scale)
    if match := _LIST.match(text):
        return pa.list_(parse_type(match.group(1)))
    raise ValueError(f"unknown type {name!r} (known: {TYPE_HELP})")


def type_name(arrow_type: pa.DataType) -> str:
    """The name parse_type reads back; ValueError for types programs cannot name (structs, maps...)."""
    if arrow_type in _NAMES:
        return _NAMES[arrow_type]
    if pa.types.is_timestamp(arrow_type):
        return f"timestamp[{arrow_type.unit}, tz={arrow_type.tz}]" if arrow_type.tz else f"timestamp[{arrow_type.unit}]"
    if pa.types.is_duration(arrow_type):
        return f"duration[{arrow_type.unit}]"
    if pa.types.is_time32(arrow_type) or pa.types.is_time64(arrow_type):
        return f"time{arrow_type.bit_width}[{arrow_type.unit}]"
    if pa.types.is_decimal128(arrow_type):
        return f"decimal128({arrow_type.precision}, {arrow_type.scale})"
    if pa.types.is_list(arrow_type):
        return f"list<{type_name(arrow_type.value_type)}>"
    raise ValueError(f"type {arrow_type} cannot be named in a program (known: {TYPE_HELP})")


def schema_from_pairs(pairs) -> pa.Schema:
    """A schema from (field, type name) pairs, in order."""
    return pa.schema([pa.field(name, parse_type(type_text)) for name, type_text in pairs])


def schema_to_pairs(schema: pa.Schema) -> list[tuple[str, str]]:
    return [(field.name, type_name(field.type)) for field in schema]


def same_fields(a: pa.Schema, b: pa.Schema) -> bool:
    """Equal names and types in the same order; nullability and metadata do not change what flows."""
    return [(f.name, f.type) for f in a] == [(f.name, f.type) for f in b]


def describe(schema: pa.Schema) -> str:
    """One line: `ts: timestamp[us], host: string`."""
    return ", ".join(f"{name}: {type_text}" for name, type_text in schema_to_pairs(schema))
