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
from typing import Any

from cdc_platform.config.model import TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import SourceTableError
from cdc_platform.model.generations import Watermark
from cdc_platform.model.tables import resolve_key
from cdc_platform.sources.base import ColumnRead, JdbcRead, SnapshotPlan
from cdc_platform.sources.mysql.catalog import (
    MappedColumn,
    describe_mysql_table,
    live_row_sql,
    quote_mysql,
    table_schema,
)
from cdc_platform.sources.mysql.connection import MysqlEndpoint, database_clock_ns

ROWS_PER_PARTITION = 250_000
INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")
# how Spark turns each mapping's read value into the lake value
_CONVERSIONS = {"hex": "hex", "timestamptz": "utc_text", "bool": "nonzero"}


@contextmanager
def snapshot_plan(
    endpoint: MysqlEndpoint, table: TableConfig, kafka: KafkaClients, topic: str, max_partitions: int
) -> Iterator[SnapshotPlan]:
    conn = endpoint.connect("snapshot")
    try:
        # 1. watermark first (see the module docstring)
        watermark = Watermark(database_clock_ns(conn), kafka.end_offsets(topic), datetime.now(UTC))
        described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
        source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {source_table}")
            counted = cur.fetchone()
            source_rows = int(counted[0]) if counted else 0
            first_type = next(c.type_name for c in described.columns if c.name == key[0]).lower()
            predicates = _predicates(cur, source_table, key[0], first_type, source_rows, max_partitions)
    finally:
        conn.close()
    read = jdbc_read(endpoint, table, mapped, mapped, predicates)
    yield SnapshotPlan(table.key, watermark, table_schema(described, key), read, source_rows, described.schema_hash(),
                       described)  # fmt: skip


def jdbc_read(
    endpoint: MysqlEndpoint, table: TableConfig, wanted: Sequence[MappedColumn], every: Sequence[MappedColumn],
    predicates: Sequence[str],
) -> JdbcRead:  # fmt: skip
    """The ``wanted`` columns, one JDBC query per predicate; soft-deleted rows left out
    (the soft-delete column is selected in the subquery so it can be filtered on)."""
    source = endpoint.config
    source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
    inner = {m.name: m for m in [*wanted, *every]}
    source_sql = "(SELECT {} FROM {}) AS snapshot_source".format(
        ", ".join(f"{m.select_sql} AS {quote_mysql(m.name)}" for m in inner.values()), source_table
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
    return JdbcRead(
        url=url,
        driver="org.mariadb.jdbc.Driver",
        user=source.user,
        password=source.password(endpoint.name),
        source_sql=source_sql,
        predicates=tuple(predicates),
        columns=tuple(ColumnRead(m.name, quote_mysql(m.name), _CONVERSIONS.get(m.decode, "cast")) for m in wanted),
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


def _predicates(
    cur: Any, source_table: str, first_key: str, key_type: str, rows: int, max_partitions: int
) -> list[str]:
    """Disjoint WHERE clauses covering the table: ranges of an integer key, hash buckets otherwise."""
    partitions = max(1, min(max_partitions, -(-rows // ROWS_PER_PARTITION)))
    ident = quote_mysql(first_key)
    if partitions == 1:
        return ["1 = 1"]
    if key_type.startswith(INTEGER_TYPES):
        cur.execute(f"SELECT MIN({ident}), MAX({ident}) FROM {source_table}")
        low_high = cur.fetchone()
        low, high = int(low_high[0] or 0), int(low_high[1] or 0)
        step = max(1, -(-(high - low + 1) // partitions))
        bounds = list(range(low, high + 1, step))
        preds = [f"{ident} >= {b} AND {ident} < {b + step}" for b in bounds]
        preds[-1] = f"{ident} >= {bounds[-1]}"  # rows inserted past the max during the read
        preds[0] = f"{ident} < {bounds[0] + step}"
        return preds
    return [f"CRC32(CAST({ident} AS CHAR)) % {partitions} = {i}" for i in range(partitions)]
