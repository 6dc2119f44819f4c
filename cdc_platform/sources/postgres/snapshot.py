"""A PostgreSQL table's snapshot plan: watermark first, then one MVCC snapshot for every reader.

Order matters for correctness:
1. the **watermark** (Kafka end offsets, then the source LSN) is taken *before* the
   snapshot: every change in Kafka before those offsets is in the snapshot, and current
   replays every change after them (``lake/current.py``, the watermark rule) — replaying
   what the snapshot holds converges, missing one would lose it. The LSN is read after
   the offsets so that a truncate after it is known not to be in the snapshot's past
   records (every record before the offsets has a lower LSN);
2. a coordinator transaction (REPEATABLE READ) exports its MVCC snapshot, and every
   Spark JDBC partition joins it (``SET TRANSACTION SNAPSHOT``): all partitions see one
   consistent state, and the coordinator counts the rows of that same state;
3. the read is split into key-range chunks of equal row counts (``chunks.py``); each
   column is read through an expression that keeps its value exact.

With ``snapshot.mode: incremental`` (the default) step 2 is skipped: the plan's short
transaction ends before the chunks are planned (each step of the key walk in a statement
of its own, ``chunks.walk_chunks``), and each chunk is read in a transaction of its own, at
its own instant after the watermark. Every change after the watermark is replayed over the
generation, so each row converges to its last change whenever its chunk was read (a key
range never loses a row to a concurrent UPDATE, see ``chunks.py``); the row count is no
longer one state's, so validation checks each key once instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from cdc_platform.config.model import TableConfig
from cdc_platform.envelope.pgtypes import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, numeric_precision_scale
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.chunks import ChunkPlan
from cdc_platform.model.generations import Watermark
from cdc_platform.model.tables import LakeColumn, SourceTable, TableSchema
from cdc_platform.sources.base import ColumnRead, JdbcRead, SnapshotPlan
from cdc_platform.sources.postgres.catalog import count_rows, describe_table, keyed_schema
from cdc_platform.sources.postgres.chunks import plan_chunks, walk_chunks
from cdc_platform.sources.postgres.slot import current_wal_position
from cdc_platform.sources.postgres.stream import PostgresEndpoint

MAX_DECIMAL_PRECISION = 38
INTEGER_KINDS = {"int16", "int32", "int64"}
# kinds JDBC reads exactly as they are
_PLAIN_KINDS = {"int16", "int32", "int64", "float32", "float64", "bool", "bytea"}
# the session settings that make text forms unambiguous (the same as capture's)
SESSION_SQL = "SET TimeZone = 'UTC'; SET IntervalStyle = 'iso_8601'; SET extra_float_digits = 1; SET lc_monetary = 'C'"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def snapshot_plan(
    endpoint: PostgresEndpoint, table: TableConfig, kafka: KafkaClients, topic: str, consistent: bool,
    resume: ChunkPlan | None = None,
) -> Iterator[SnapshotPlan]:  # fmt: skip
    """Plans the chunks in one short REPEATABLE READ transaction; when ``consistent``, the
    coordinator keeps it open (its exported snapshot is every chunk's) while the caller reads.
    ``resume`` (incremental only): the stored plan's watermark and chunks, while the table
    has the plan's shape; otherwise a new plan."""
    if resume is not None and not consistent:
        with endpoint.connect("snapshot") as conn:
            described, schema = describe(conn, table)
            vouched = key_unique_per_read(conn, described, schema)
            distinct = distinct_columns(conn, described, schema)
        if described.schema_hash() == resume.schema_hash:
            read = jdbc_read(endpoint, described, schema, list(resume.predicates), None)
            yield SnapshotPlan(
                table.key, resume.watermark, schema, read, resume.source_rows, resume.schema_hash, described,
                consistent=False, resumed=True, key_unique_per_chunk=vouched, distinct_columns=distinct,
            )  # fmt: skip
            return
    with endpoint.connect("snapshot") as coordinator:
        offsets = kafka.end_offsets(topic)  # first: see the module docstring
        watermark = Watermark(current_wal_position(coordinator), offsets, datetime.now(UTC))
        coordinator.execute(SESSION_SQL)  # the chunk boundaries' text forms are the readers'
        coordinator.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        exported = coordinator.execute("SELECT pg_export_snapshot()").fetchone() if consistent else None
        described, schema = describe(coordinator, table)
        vouched = key_unique_per_read(coordinator, described, schema)
        distinct = distinct_columns(coordinator, described, schema)
        if consistent:  # the chunks of the exported snapshot's state, counted in it
            source_rows, predicates = _chunks_in_snapshot(coordinator, described, schema, table.snapshot.chunk_rows)
        else:  # no transaction outlives a statement of the plan; each chunk reads in its own
            coordinator.execute("COMMIT")
            source_rows, predicates = _incremental_chunks(coordinator, described, schema, table.snapshot.chunk_rows)
        read = jdbc_read(endpoint, described, schema, predicates, str(exported[0]) if exported else None)
        yield SnapshotPlan(
            table.key, watermark, schema, read, source_rows, described.schema_hash(), described, consistent,
            key_unique_per_chunk=vouched, distinct_columns=distinct,
        )  # fmt: skip
        if consistent:
            coordinator.execute("COMMIT")


# key kinds whose lake values are one-to-one with the values the key's index holds apart
_ONE_TO_ONE = {"int16", "int32", "int64", "numeric", "money", "bool", "date", "timestamp", "timestamptz", "uuid",
               "bytea", "enum", "text"}  # fmt: skip
_PLAIN_TEXT = {"text", "varchar", "bpchar", "name", "char"}  # kind text also covers inet, bit, xml, …


def _primary_key(described: SourceTable, schema: TableSchema) -> bool:
    return tuple(schema.key) == described.primary_key


def key_unique_per_read(conn: psycopg.Connection[tuple[Any, ...]], described: SourceTable, schema: TableSchema) -> bool:
    """Whether no chunk's read can return a key twice: the lake's key is the table's
    primary key (its unique index holds in each chunk's read, one statement, one MVCC
    snapshot), and no table inherits from it. A legacy inheritance child's rows are read
    with its parent's, and the parent's key does not cover them. A partitioned table's key
    does cover its partitions. And every key column's lake value is shown one-to-one with
    its PostgreSQL value (``_ONE_TO_ONE``; a timetz key, which is not, is refused by
    ``keyed_schema`` before a plan is made)."""
    if not _primary_key(described, schema):
        return False
    key_types = [c.pgtype for c in schema.columns if c.name in schema.key]
    if not all(t.kind in _ONE_TO_ONE and (t.kind != "text" or t.name in _PLAIN_TEXT) for t in key_types):
        return False
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE i.inhparent = %s::regclass AND p.relkind = 'r')",
        (f"{quote_ident(described.schema)}.{quote_ident(described.name)}",),
    ).fetchone()
    return row is not None and not row[0]


# the share of a table's rows a column's distinct values must reach in ANALYZE's estimate
# for the generation to write it without a Parquet dictionary. Below it a chunk may hold a
# value often enough for Parquet's dictionary to save space (at two rows a value, up to half
# the column); at nine in ten rows distinct it saves a tenth at most, for every value hashed
NEARLY_UNIQUE = 0.9


def distinct_columns(
    conn: psycopg.Connection[tuple[Any, ...]], described: SourceTable, schema: TableSchema
) -> tuple[str, ...]:
    """The table's columns whose values are (nearly) all distinct: a one-column primary key,
    and the columns ANALYZE estimates at ``NEARLY_UNIQUE`` of the rows or more distinct
    (``pg_stats.n_distinct``: negative, a share of the rows; positive, a count). A table
    never analyzed has no statistics: its key alone. Only a write's speed depends on it
    (``lake.tables.parquet_dictionary_off``), never a value."""
    found = list(described.primary_key) if len(described.primary_key) == 1 else []
    rows = conn.execute(
        """SELECT s.attname FROM pg_stats s
           JOIN pg_namespace n ON n.nspname = s.schemaname
           JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
           WHERE s.schemaname = %s AND s.tablename = %s
           GROUP BY s.attname
           HAVING bool_and(s.n_distinct <= -%s
                           OR (s.n_distinct > 0 AND s.n_distinct >= %s * greatest(c.reltuples, 1)))""",
        (described.schema, described.name, NEARLY_UNIQUE, NEARLY_UNIQUE),
    ).fetchall()
    found += [str(r[0]) for r in rows]
    names = {c.name for c in schema.columns}
    return tuple(dict.fromkeys(n for n in found if n in names))


def _chunks_in_snapshot(
    conn: psycopg.Connection[tuple[Any, ...]], described: SourceTable, schema: TableSchema, chunk_rows: int
) -> tuple[int, list[str]]:
    rows = count_rows(conn, described.schema, described.name)
    key_nullable = any(c.nullable for c in schema.columns if c.name in schema.key)
    return rows, plan_chunks(conn, described.schema, described.name, schema.key, key_nullable, rows, chunk_rows)


def _incremental_chunks(
    conn: psycopg.Connection[tuple[Any, ...]], described: SourceTable, schema: TableSchema, chunk_rows: int
) -> tuple[int, list[str]]:
    """The primary key's index is walked a step at a time. A configured key may have no
    index: then each step would sort the table, so its keys are numbered in one statement
    (one scan, as each chunk's read of such a key is anyway)."""
    if not _primary_key(described, schema):
        return _chunks_in_snapshot(conn, described, schema, chunk_rows)
    key_nullable = any(c.nullable for c in schema.columns if c.name in schema.key)
    return walk_chunks(
        conn, described.schema, described.name, schema.key, key_nullable, described.estimated_rows, chunk_rows
    )


def describe(conn: psycopg.Connection[tuple[Any, ...]], table: TableConfig) -> tuple[SourceTable, TableSchema]:
    described = describe_table(conn, table.schema_name, table.table_name)
    return described, keyed_schema(conn, described, table.primary_key, f"tables[{table.key}].primary_key")


def jdbc_read(
    endpoint: PostgresEndpoint,
    described: SourceTable,
    schema: TableSchema,
    predicates: list[str],
    snapshot_id: str | None,
) -> JdbcRead:
    """Every partition's connection joins the exported snapshot (when given). The chunk
    predicates name the table's own columns, and Spark applies them to the read's result
    (``SELECT … FROM (<source_sql>) WHERE <predicate>``): so the result keeps each key
    column as it is in the table, and a key column read through a conversion (numeric as
    text, an instant as microseconds, …) is read under another name. Compared after the
    conversion, a chunk's range would follow another order than the one its boundaries
    were chosen in: rows left out, or read twice."""
    source = endpoint.config
    columns = tuple(_keep_key_order(column_read(c), i, schema.key) for i, c in enumerate(schema.columns))
    raw_keys = [quote_ident(c.name) for c in columns if c.source]  # the key columns as the table has them
    source_sql = "(SELECT {} FROM {}.{}) AS snapshot_source".format(
        ", ".join([*(c.select_sql for c in columns), *raw_keys]),
        quote_ident(described.schema),
        quote_ident(described.name),
    )
    init = SESSION_SQL
    if snapshot_id is not None:
        init += f"; BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
    options = {
        "fetchsize": "10000",
        "sessionInitStatement": init,
        "preferTimestampNTZ": "true",
        "ApplicationName": f"cdc_platform_snapshot_{endpoint.name}",
        **{k: v for k, v in source.connect_options.items() if k in ("sslmode", "connect_timeout")},
    }
    return JdbcRead(
        url=f"jdbc:postgresql://{source.host}:{source.port}/{source.database}",
        driver="org.postgresql.Driver",
        user=source.user,
        password=source.password(endpoint.name),
        source_sql=source_sql,
        predicates=tuple(predicates),
        columns=columns,
        options=options,
    )


def _keep_key_order(read: ColumnRead, position: int, key: tuple[str, ...]) -> ColumnRead:
    """A key column read through a conversion, renamed (its name is the raw column's)."""
    ident = quote_ident(read.name)
    if read.name not in key or read.select_sql == ident:
        return read
    alias = f"_cdc_read_{position}"
    expression = read.select_sql.removesuffix(f" AS {ident}")
    return replace(read, select_sql=f"{expression} AS {quote_ident(alias)}", source=alias)


def column_read(column: LakeColumn) -> ColumnRead:
    """The SELECT expression for a column. JDBC's own mappings are lossy for several
    types (numeric without scale, time, interval, arrays), so those are cast to text or
    JSON in PostgreSQL and converted exactly in Spark."""
    name, pgtype = column.name, column.pgtype
    ident = quote_ident(name)
    kind = pgtype.kind
    if kind == "array":
        return ColumnRead(name, f"to_json({ident})::text AS {ident}", "json_array")
    if kind == "timetz":  # the UTC time with 'Z', as capture's ZonedTime
        return ColumnRead(name, f"regexp_replace(({ident} AT TIME ZONE 'UTC')::text, '\\+00$', 'Z') AS {ident}")
    if kind == "money":
        return ColumnRead(name, f"{ident}::numeric(19,2) AS {ident}")
    if kind == "date":  # days since 1970, as capture: JDBC's java.sql.Date rebases through the Julian calendar
        days = f"{ident} - DATE '1970-01-01'"
        return ColumnRead(name, f"{_infinite_as(ident, INT32_MAX, INT32_MIN, days)} AS {ident}", "unix_date")
    if kind in ("timestamp", "timestamptz"):  # microseconds since 1970 (UTC for timestamptz), as capture
        return ColumnRead(name, f"{_instant_micros(ident, kind)} AS {ident}", "unix_micros")
    if kind in _PLAIN_KINDS or (kind == "numeric" and fits_decimal(column.typmod)):
        return ColumnRead(name, ident)
    if pgtype.name in ("text", "varchar", "bpchar", "name"):
        # read as is: char(n)::text would drop the padding that the column (and capture) keep
        return ColumnRead(name, ident)
    return ColumnRead(name, f"{ident}::text AS {ident}")


# EXTRACT(EPOCH ...) is numeric since PostgreSQL 14: 10M instants took the backend 4.5-6.7 s
# that way, 2.8 s through date_part's float8 epoch (a bigint column: 1.7-2.4 s; docs/benchmarks.md,
# "Snapshots"). The float is exact only while a double holds the microseconds with room for
# two roundings (the division by 10^6, the product): below 2^51 us either side of 1970, i.e.
# 1898-2041. Outside these years (and for infinity) the numeric path reads them.
FLOAT_EPOCH_AFTER, FLOAT_EPOCH_BEFORE = "1900-01-01 00:00:00", "2040-01-01 00:00:00"


def _instant_micros(ident: str, kind: str) -> str:
    zone = "+00" if kind == "timestamptz" else ""
    inside = f"{ident} > '{FLOAT_EPOCH_AFTER}{zone}'::{kind} AND {ident} < '{FLOAT_EPOCH_BEFORE}{zone}'::{kind}"
    exact = _infinite_as(ident, INT64_MAX, INT64_MIN, f"(EXTRACT(EPOCH FROM {ident}) * 1000000)::bigint")
    return f"CASE WHEN {inside} THEN (date_part('epoch', {ident}) * 1000000)::bigint ELSE {exact} END"


def _infinite_as(ident: str, top: int, bottom: int, finite: str) -> str:
    """PostgreSQL's ±infinity as capture represents it (the extreme integers)."""
    return f"CASE WHEN {ident} = 'infinity' THEN {top} WHEN {ident} = '-infinity' THEN {bottom} ELSE {finite} END"


def fits_decimal(typmod: int) -> bool:
    """numeric(p,s) with p <= 38 is a Spark decimal, read exactly by JDBC; anything else is text."""
    precision_scale = numeric_precision_scale(typmod)
    return precision_scale is not None and precision_scale[0] <= MAX_DECIMAL_PRECISION
