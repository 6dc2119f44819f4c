"""A polled (MariaDB/MySQL) table's snapshot plan: a parallel Spark JDBC read.

What differs from PostgreSQL, and why:

* **Watermark**: the database clock (nanoseconds), read *before* the table. Poll events
  carry positions from the same clock taken when their poll started, so current applies
  exactly the polls that started after the watermark; an older poll's row is in the
  snapshot or superseded by it.
* **Consistency**: MariaDB cannot share one read view across connections (no
  ``pg_export_snapshot``), so each Spark partition is its own consistent read, all after
  the watermark. A row changed during the read is in the snapshot at some version at or
  after the watermark, and the poll that saw its change comes after the watermark too.
  The row count moves with the workload, so the generation is validated by "each key
  once", not by an exact count.
* **Types**: every column is read through the mapping's SELECT expression
  (``catalog.py``) — the same text the poller reads — and converted to the lake type in
  Spark. Soft-deleted rows are left out (they are deletes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from cdc_platform.config.model import TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.chunks import ChunkPlan
from cdc_platform.model.errors import SourceTableError
from cdc_platform.model.generations import Watermark
from cdc_platform.model.tables import SourceTable
from cdc_platform.sources.base import ColumnRead, JdbcRead, SnapshotPlan
from cdc_platform.sources.mysql.catalog import (
    OID_INT2,
    OID_INT4,
    OID_INT8,
    OID_TEXT,
    MappedColumn,
    describe_mysql_table,
    live_row_sql,
    polled_key,
    quote_mysql,
    table_schema,
)
from cdc_platform.sources.mysql.chunks import literal_kind, plan_chunks
from cdc_platform.sources.mysql.connection import MysqlEndpoint, database_clock_ns

# how Spark turns each mapping's read value into the lake value
_CONVERSIONS = {"hex": "hex", "timestamptz": "utc_text", "bool": "nonzero"}


@contextmanager
def snapshot_plan(
    endpoint: MysqlEndpoint, table: TableConfig, kafka: KafkaClients, topic: str, resume: ChunkPlan | None = None
) -> Iterator[SnapshotPlan]:
    """Key-range chunks of ``snapshot.chunk_rows`` rows, each read by a Spark task in its
    own consistent read. ``resume``: the stored plan's watermark and chunks, while the
    table has the plan's shape; otherwise a new plan."""
    conn = endpoint.connect("snapshot")
    try:
        described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        key = polled_key(described, mapped, table.primary_key, f"tables[{table.key}].primary_key")
        vouched = key_unique_per_read(described, mapped, key)
        if resume is not None and described.schema_hash() == resume.schema_hash:
            read = jdbc_read(endpoint, table, mapped, mapped, resume.predicates, key)
            yield SnapshotPlan(table.key, resume.watermark, table_schema(described, key), read, resume.source_rows,
                               resume.schema_hash, described, consistent=False, resumed=True,
                               key_unique_per_chunk=vouched, distinct_columns=_distinct(key, vouched))  # fmt: skip
            return
        # 1. watermark first (see the module docstring)
        watermark = Watermark(database_clock_ns(conn), kafka.end_offsets(topic), datetime.now(UTC))
        source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {source_table}")
            counted = cur.fetchone()
            source_rows = int(counted[0]) if counted else 0
            literals_as = {m.name: literal_kind(m.source_type, m.decode) for m in mapped if m.name in key}
            nullable = any(c.nullable for c in described.columns if c.name in key)
            predicates = plan_chunks(
                cur, source_table, key, literals_as, nullable, source_rows, table.snapshot.chunk_rows
            )
    finally:
        conn.close()
    read = jdbc_read(endpoint, table, mapped, mapped, predicates, key)
    yield SnapshotPlan(table.key, watermark, table_schema(described, key), read, source_rows, described.schema_hash(),
                       described, consistent=False, key_unique_per_chunk=vouched,
                       distinct_columns=_distinct(key, vouched))  # fmt: skip


def _distinct(key: tuple[str, ...], primary: bool) -> tuple[str, ...]:
    """A one-column primary key's column: its values are all distinct (MariaDB keeps no
    per-column distinct estimate outside indexes; the other columns keep Parquet's dictionary)."""
    return key if primary and len(key) == 1 else ()


# key mappings whose lake value is the very value MariaDB's index compares: integers (and
# YEAR, BIT below 64 bits, read as unsigned integers) and strings read as they are. Left
# out: TINYINT(1) (read as a boolean: 1 and 2 are both true), unsigned BIGINT and DECIMAL
# (read through text), dates (zero and invalid dates), floats, ENUM/SET/CHAR (cast to
# text) and binary strings (hex; Delta keeps no statistics for them anyway).
_ONE_TO_ONE_OIDS = {OID_INT2, OID_INT4, OID_INT8, OID_TEXT}


def key_unique_per_read(described: SourceTable, mapped: Sequence[MappedColumn], key: Sequence[str]) -> bool:
    """Whether no chunk's read can return a key twice: the lake's key is the table's primary
    key (each chunk is one statement, one consistent read under its unique index; MariaDB has
    no table inheritance, and a partitioned table's key covers its partitions), and every key
    column's lake value is one-to-one with the value the index holds apart
    (``_ONE_TO_ONE_OIDS``, read as is). Validation then trusts each file of the generation
    to hold distinct keys (``lake/key_proof.py``)."""
    if tuple(key) != tuple(described.primary_key):
        return False
    by_name = {m.name: m for m in mapped}
    return all(_read_as_is(by_name.get(name)) for name in key)


def _read_as_is(column: MappedColumn | None) -> bool:
    return column is not None and column.decode == "plain" and column.pg_oid in _ONE_TO_ONE_OIDS


def jdbc_read(
    endpoint: MysqlEndpoint, table: TableConfig, wanted: Sequence[MappedColumn], every: Sequence[MappedColumn],
    predicates: Sequence[str], key: Sequence[str] = (),
) -> JdbcRead:  # fmt: skip
    """The ``wanted`` columns, one JDBC query per predicate; soft-deleted rows left out
    (the soft-delete column is selected in the subquery so it can be filtered on). The
    chunk predicates name the table's own columns and Spark applies them to the subquery's
    result, so a ``key`` column read through a conversion (text of a date, an enum, an
    unsigned bigint) is read under another name and the column itself is kept: compared
    after the conversion, a range would follow another order than its boundaries'."""
    source = endpoint.config
    source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
    inner = {m.name: m for m in [*wanted, *every]}
    converted = {
        n: f"_cdc_read_{i}" for i, (n, m) in enumerate(inner.items()) if n in key and m.select_sql != quote_mysql(n)
    }
    selected = [f"{m.select_sql} AS {quote_mysql(converted.get(m.name, m.name))}" for m in inner.values()]
    source_sql = "(SELECT {} FROM {}) AS snapshot_source".format(
        ", ".join([*selected, *(quote_mysql(n) for n in converted)]), source_table
    )
    live = _live_rows(table, every)
    if live:  # soft-deleted rows are deletes: a generation must not bring them back
        predicates = [f"({p}) AND {live}" for p in predicates]
    # Spark's MySQL dialect (backtick quoting) handles jdbc:mysql URLs; Connector/J accepts
    # that scheme with permitMysqlScheme
    url = (
        f"jdbc:mysql://{source.host}:{source.port}/{source.database}"
        f"?permitMysqlScheme&connectTimeout={source.connect_timeout_s * 1000}"
    )
    columns = tuple(
        ColumnRead(m.name, quote_mysql(m.name), _CONVERSIONS.get(m.decode, "cast"), converted.get(m.name, ""))
        for m in wanted
    )
    return JdbcRead(
        url=url,
        driver="org.mariadb.jdbc.Driver",
        user=source.user,
        password=source.password(endpoint.name),
        source_sql=source_sql,
        predicates=tuple(predicates),
        columns=columns,
        options={"fetchsize": "10000", "sessionInitStatement": "SET time_zone = '+00:00'"},
    )


def _live_rows(table: TableConfig, mapped: Sequence[MappedColumn]) -> str | None:
    column = table.poll.soft_delete_column if table.poll else None
    if column is None:
        return None
    found = [m for m in mapped if m.name == column]
    if not found:
        raise SourceTableError(
            f"tables[{table.key}].poll.soft_delete_column: '{column}' is not a column of {table.key}"
        )
    return live_row_sql(found[0])
