"""How each PostgreSQL type is stored in the lake (Spark/Delta), exactly.

One mapping serves the snapshot (read with Spark JDBC) and, later, the changelog (decoded
from envelopes), so both land identical values for the same row:

| PostgreSQL | lake (Spark) | why |
|---|---|---|
| smallint / integer / bigint | short / int / long | |
| real / double precision | float / double | |
| numeric(p,s), p ≤ 38 | decimal(p,s) | exact |
| numeric, or p > 38 | string (PostgreSQL's text) | Spark decimals stop at 38 digits; text keeps every digit |
| money | decimal(19,2) | |
| boolean, date, bytea | boolean, date, binary | |
| timestamp | timestamp_ntz | no zone in the source, none invented |
| timestamp with time zone | timestamp (UTC instant) | |
| time | string 'HH:MM:SS[.ffffff]' | Spark has no time-of-day type |
| time with time zone | string 'HH:MM:SS[.f]Z' in UTC | as capture writes it |
| interval | string, ISO 8601 | Delta has no interval type; text is exact |
| uuid, json, jsonb, enum, text, inet, … | string | |
| arrays | array of the element's lake type (nested by declared dimensions) | |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_platform.envelope.pgtypes import PgType, numeric_precision_scale

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

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


@dataclass(frozen=True)
class SnapshotColumn:
    """One column of a snapshot read: the SQL that PostgreSQL evaluates, and how Spark
    turns the JDBC value into the lake type."""

    name: str
    select_sql: str  # already quoted
    lake: DataType
    from_json: bool  # arrays travel as JSON text and are parsed with the lake type


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def snapshot_column(name: str, pgtype: PgType, typmod: int, dims: int = 1) -> SnapshotColumn:
    """The SELECT expression for a column. JDBC's own mappings are lossy for several
    types (numeric without scale, time, interval, arrays), so those are cast to text or
    JSON in PostgreSQL and converted exactly in Spark."""
    ident = quote_ident(name)
    lake = lake_type(pgtype, typmod, dims)
    kind = pgtype.kind
    if kind == "array":
        return SnapshotColumn(name, f"to_json({ident})::text AS {ident}", lake, from_json=True)
    if kind == "timetz":
        # the UTC time with 'Z', as capture's ZonedTime
        expr = f"regexp_replace(({ident} AT TIME ZONE 'UTC')::text, '\\+00$', 'Z') AS {ident}"
        return SnapshotColumn(name, expr, lake, from_json=False)
    if kind == "money":
        return SnapshotColumn(name, f"{ident}::numeric(19,2) AS {ident}", lake, from_json=False)
    if kind in ("int16", "int32", "int64", "float32", "float64", "bool", "date", "timestamp", "timestamptz", "bytea"):
        return SnapshotColumn(name, ident, lake, from_json=False)
    if kind == "numeric" and lake.typeName() == "decimal":
        return SnapshotColumn(name, ident, lake, from_json=False)
    if pgtype.name in ("text", "varchar", "bpchar", "name"):
        # read as is: char(n)::text would drop the padding that the column (and capture) keep
        return SnapshotColumn(name, ident, lake, from_json=False)
    return SnapshotColumn(name, f"{ident}::text AS {ident}", lake, from_json=False)
