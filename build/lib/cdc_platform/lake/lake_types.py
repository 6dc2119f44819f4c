"""How each PostgreSQL type is stored in the lake (Spark/Delta), exactly.

One mapping serves the snapshot (read with Spark JDBC) and the changelog (decoded from
envelopes), so both land identical values for the same row:

| PostgreSQL | lake (Spark) | why |
|---|---|---|
| smallint / integer / bigint | short / int / long | |
| real / double precision | float / double | |
| numeric(p,s), p ≤ 38 | decimal(p,s) | exact; NaN refused (a dead letter) |
| numeric, or p > 38 | string (PostgreSQL's text) | Spark decimals stop at 38 digits; text keeps every digit |
| money | decimal(19,2) | |
| boolean, date, bytea | boolean, date, binary | dates of any year (BC too); ±infinity as the extreme days |
| timestamp | timestamp_ntz | no zone in the source, none invented; ±infinity as the extreme microseconds |
| timestamp with time zone | timestamp (UTC instant) | as timestamp; past 294247-01-10 refused (64-bit µs) |
| time | string 'HH:MM:SS[.ffffff]' | Spark has no time-of-day type |
| time with time zone | string 'HH:MM:SS[.f]Z' in UTC | as capture writes it |
| interval | string, ISO 8601 | Delta has no interval type; text is exact |
| uuid, json, jsonb, enum, text, inet, … | string | |
| arrays | array of the element's lake type (nested by declared dimensions) | another depth is refused | |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_platform.envelope.pgtypes import PgType, numeric_precision_scale
from cdc_platform.model.tables import TableSchema

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

MAX_SPARK_DECIMAL_PRECISION = 38


def lake_type(pgtype: PgType, typmod: int, dims: int = 1) -> DataType:
    from pyspark.sql import types as T

    kind = pgtype.kind
    if kind == "array":
        assert pgtype.element is not None
        inner = lake_type(pgtype.element, typmod)
        for _ in range(max(dims, 1)):
            inner = T.ArrayType(inner, containsNull=True)
        return inner
    simple: dict[str, DataType] = {
        "int16": T.ShortType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "float32": T.FloatType(),
        "float64": T.DoubleType(),
        "bool": T.BooleanType(),
        "date": T.DateType(),
        "timestamp": T.TimestampNTZType(),
        "timestamptz": T.TimestampType(),
        "bytea": T.BinaryType(),
        "money": T.DecimalType(19, 2),
    }
    if kind in simple:
        return simple[kind]
    if kind == "numeric":
        precision_scale = numeric_precision_scale(typmod)
        if precision_scale is not None and precision_scale[0] <= MAX_SPARK_DECIMAL_PRECISION:
            return T.DecimalType(*precision_scale)
    return T.StringType()


def row_type(schema: TableSchema) -> StructType:
    """The table's row as a Spark struct of lake types (the changelog's before/after images)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(c.name, lake_type(c.pgtype, c.typmod, c.dims), True) for c in schema.columns])
