"""Arrow tables on their way into Spark and back, so both ways agree on types.

Ramen's event times are naive `timestamp[...]` in UTC. Spark reads a naive Arrow timestamp (or a
Parquet one not marked UTC) as TIMESTAMP_NTZ but Arrow handed to createDataFrame as TIMESTAMP:
so tables going in are marked UTC first, whichever way they travel, and the SQL always sees
TIMESTAMP in a UTC session. Results come back UTC-marked; `conform` casts them to the declared
naive type without changing a value.
"""

from __future__ import annotations

import pyarrow as pa

from ramen.program.model import split_qualified


def view_name(parent: str) -> str:
    """The SQL name of a parent: its function name (docs/programs.md), even across programs."""
    return split_qualified(parent)[1] if "/" in parent else parent


def utc_schema(schema: pa.Schema) -> pa.Schema:
    fields = []
    for field in schema:
        if pa.types.is_timestamp(field.type) and field.type.tz is None:
            field = field.with_type(pa.timestamp("us", tz="UTC"))
        fields.append(field)
    return pa.schema(fields)


def for_spark(table: pa.Table) -> pa.Table:
    """The table with naive timestamps marked UTC (values unchanged), and no metadata."""
    schema = utc_schema(table.schema.remove_metadata())
    return table.replace_schema_metadata(None).cast(schema) if schema != table.schema else table
