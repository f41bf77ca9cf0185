"""The load-time check of a Spark function: Spark parses and analyses its SQL against the
parents' schemas (empty views of those schemas; no data, no job), and its output must hold the
function's declared fields. Run by `ramen run` before a program is stored.
"""

from __future__ import annotations

import pyarrow as pa

from ramen.program.model import ENGINE_SPARK, Function, Program
from ramen.spark.frames import for_spark, view_name
from ramen.spark.session import SparkUnavailable, is_unavailable, one_line


class SparkSqlError(ValueError):
    """The SQL does not analyse, or its output does not fit the schema; one line naming the function."""


def spark_functions(program: Program) -> list[Function]:
    return [f for f in program if f.engine == ENGINE_SPARK]


def analyse(spark, function: Function) -> pa.Schema:
    """The Arrow schema of the function's SQL output; SparkSqlError if Spark refuses it,
    SparkUnavailable if Spark cannot be reached."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
    for parent, schema in function.input_schemas:
        try:
            empty = for_spark(schema.empty_table())
            spark.createDataFrame(empty, schema=from_arrow_schema(empty.schema)) \
                .createOrReplaceTempView(view_name(parent))
        except Exception as e:  # noqa: BLE001 - classified: unavailable, else an error of the schema
            if is_unavailable(e):
                raise SparkUnavailable(one_line(e)) from None
            raise SparkSqlError(f"{function.qualified_name}: parent {parent}: {one_line(e)}") from None
    try:
        spark_schema = spark.sql(function.sql).schema  # analysis happens here, on the server
    except Exception as e:  # noqa: BLE001 - Spark's refusal is the user's error
        if is_unavailable(e):
            raise SparkUnavailable(one_line(e)) from None
        raise SparkSqlError(f"{function.qualified_name}: Spark SQL: {one_line(e)}") from None
    output = to_arrow_schema(spark_schema, timezone="UTC")
    _check_fits(function, output)
    return output



def _check_fits(function: Function, output: pa.Schema) -> None:
    produced = {field.name: field.type for field in output}
    missing = [f.name for f in function.schema if f.name not in produced]
    if missing:
        raise SparkSqlError(f"{function.qualified_name}: its SQL outputs ({', '.join(output.names)}), "
                            f"not {', '.join(missing)} of its schema")
    for field in function.schema:
        try:
            pa.array([], produced[field.name]).cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise SparkSqlError(f"{function.qualified_name}: its SQL outputs {field.name} as "
                                f"{produced[field.name]}, which cannot become the declared {field.type}") from None


def check_program(spark, program: Program) -> None:
    for function in spark_functions(program):
        analyse(spark, function)
