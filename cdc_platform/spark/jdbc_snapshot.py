"""A snapshot generation of a polled (jdbc) table: a parallel Spark JDBC read into Delta.

Same generation layout and commit metadata as the PostgreSQL snapshot, so changelog and
current work unchanged. What differs, and why:

* **Watermark**: the database clock (nanoseconds), read *before* the table. Poll events
  carry positions from the same clock taken when their poll started, so current applies
  exactly the polls that started after the watermark; an older poll's row is in the
  snapshot or superseded by it.
* **Consistency**: MariaDB cannot share one read view across connections (no
  ``pg_export_snapshot``), so each Spark partition is its own consistent read, all after
  the watermark. A row changed during the read is in the snapshot at some version at or
  after the watermark, and the poll that saw its change comes after the watermark too.
* **Check**: written rows must hold each key once (the partitions are disjoint); the
  source's row count moves with the workload, so it is reported, not required equal.
* **Types**: every column is read through the mapping's SELECT expression
  (``capture/mysql_catalog.py``) — the same text the poller reads — and converted to the
  lake type in Spark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.capture.errors import CaptureError
from cdc_platform.capture.jdbc import connect_mysql, database_clock_ns
from cdc_platform.capture.mysql_catalog import MappedColumn, describe_mysql_table, live_row_sql, quote_mysql
from cdc_platform.capture.pg_catalog import SourceTableError, resolve_key
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.spark.lake_types import lake_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from cdc_platform.spark.snapshot import SnapshotResult

ROWS_PER_PARTITION = 250_000
INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")


def take_jdbc_snapshot(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    generation: str,
    log_progress: Callable[[str], None],
) -> SnapshotResult:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from cdc_platform.spark.snapshot import (
        PROGRESS_INTERVAL_S,
        SnapshotError,
        SnapshotResult,
        SparkProgress,
        Watermark,
        kafka_end_offsets,
        snapshot_path,
    )

    started = time.monotonic()
    src = config.jdbc(table.source)
    topic = config.topic_for(table)
    try:
        conn = connect_mysql(src, table.source, "snapshot")
    except CaptureError as exc:
        raise SnapshotError(str(exc)) from None
    try:
        # 1. watermark first (see the module docstring)
        watermark = Watermark(database_clock_ns(conn), kafka_end_offsets(config, topic), datetime.now(UTC).isoformat())
        described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
        source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {source_table}")
            counted = cur.fetchone()
            source_rows = int(counted[0]) if counted else 0
            max_partitions = max(1, spark.sparkContext.defaultParallelism * 2)
            predicates = _predicates(cur, source_table, key[0], described_type(described, key[0]), source_rows,
                                     max_partitions)  # fmt: skip
    except SourceTableError as exc:
        raise SnapshotError(str(exc)) from None
    finally:
        conn.close()
    log_progress(
        f"{table.key}: snapshot {generation}: ~{source_rows} rows at watermark {watermark.lsn} (database clock), "
        f"{len(predicates)} Spark partition(s)"
    )
    frame = read_jdbc(spark, config, table, mapped, predicates)
    path = snapshot_path(config, table, generation)
    info = {
        "generation": generation,
        "watermark_lsn": watermark.lsn,
        "key_columns": list(key),
        "connector": "jdbc",
        **watermark.as_dict(),
        "lsn": str(watermark.lsn),
    }
    progress = SparkProgress(
        spark, f"{table.key}: snapshot {generation}", source_rows, log_progress, PROGRESS_INTERVAL_S
    )
    progress.start()
    try:
        frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
            "userMetadata", json.dumps(info)
        ).save(path)
    finally:
        progress.stop()
    written = spark.read.format("delta").load(path)
    stats = written.agg(
        F.count(F.lit(1)).alias("n"), F.count_distinct(*[F.col(quote_spark(k)) for k in key]).alias("keys")
    ).first()
    rows = int(stats["n"]) if stats else 0
    if stats is not None and int(stats["keys"]) != rows:
        raise SnapshotError(
            f"{table.key}: snapshot {generation} holds {rows} rows but {stats['keys']} distinct keys; the key "
            f"({', '.join(key)}) is not unique in the source, set tables[{table.key}].primary_key"
        )
    detail = DeltaTable.forPath(spark, path).detail().select("sizeInBytes").first()
    result = SnapshotResult(
        generation=generation,
        path=path,
        rows=rows,
        source_rows=source_rows,
        bytes=int(detail["sizeInBytes"]) if detail else 0,
        watermark=watermark,
        duration_s=round(time.monotonic() - started, 3),
        schema_hash=described.schema_hash(),
        spark_partitions=len(predicates),
        key_columns=key,
        columns=[(m.name, _lake(m).simpleString()) for m in mapped],
    )
    log_progress(
        f"{table.key}: snapshot {generation}: wrote {rows} rows ({result.bytes} bytes) in {result.duration_s} s"
    )
    return result


def read_jdbc(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    mapped: list[MappedColumn],
    predicates: list[str],
    mapped_all: list[MappedColumn] | None = None,
) -> DataFrame:
    """The table's ``mapped`` columns as a Spark frame of lake types, one JDBC query per predicate."""
    src = config.jdbc(table.source)
    source_table = f"{quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
    # the soft-delete column is filtered on inside the subquery, so it is selected there too
    inner = {m.name: m for m in [*mapped, *(mapped_all or [])]}
    query = "(SELECT {} FROM {}) AS snapshot_source".format(
        ", ".join(f"{m.select_sql} AS {quote_mysql(m.name)}" for m in inner.values()), source_table
    )
    properties = {
        "user": src.user,
        "password": src.password(table.source).get_secret_value(),
        "driver": "org.mariadb.jdbc.Driver",
        "fetchsize": "10000",
        "sessionInitStatement": "SET time_zone = '+00:00'",
    }
    # Spark's MySQL dialect (backtick quoting) handles jdbc:mysql URLs; Connector/J accepts
    # that scheme with permitMysqlScheme
    url = (
        f"jdbc:mysql://{src.host}:{src.port}/{src.database}"
        f"?permitMysqlScheme&connectTimeout={src.connect_timeout_s * 1000}"
    )
    live = _live_rows(table, mapped_all or mapped)
    if live:  # soft-deleted rows are deletes: a generation must not bring them back
        predicates = [f"({p}) AND {live}" for p in predicates]
    raw = spark.read.jdbc(url=url, table=query, predicates=predicates, properties=properties)
    return raw.select(*[_lake_column(m) for m in mapped])


def read_source_keys(spark: SparkSession, config: PlatformConfig, table: TableConfig, keys: list[str]) -> DataFrame:
    """The key columns of every row the source holds now (for finding hard deletes)."""
    conn = connect_mysql(config.jdbc(table.source), table.source, "keys")
    try:
        _, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
    finally:
        conn.close()
    by_name = {m.name: m for m in mapped}
    return read_jdbc(spark, config, table, [by_name[k] for k in keys], ["1 = 1"], mapped)


def _live_rows(table: TableConfig, mapped: list[MappedColumn]) -> str | None:
    column = table.poll.soft_delete_column if table.poll else None
    if column is None:
        return None
    found = [m for m in mapped if m.name == column]
    if not found:
        raise SourceTableError(
            f"tables[{table.key}].poll.soft_delete_column: '{column}' is not a column of {table.key}"
        )
    return live_row_sql(found[0])


def described_type(described: Any, column: str) -> str:
    return str(next(c.type_name for c in described.columns if c.name == column)).lower()


def quote_spark(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _lake(m: MappedColumn) -> DataType:
    pgtype = builtin_type(m.pg_oid)
    assert pgtype is not None
    return lake_type(pgtype, m.typmod)


def _lake_column(m: MappedColumn) -> Column:
    from pyspark.sql import functions as F

    column, lake = F.col(quote_spark(m.name)), _lake(m)
    if m.decode == "hex":
        converted = F.unhex(column)
    elif m.decode == "timestamptz":
        converted = F.concat(column, F.lit("Z")).cast(lake)  # the session ran in UTC
    elif m.decode == "bool":
        converted = (column.cast("long") != 0).cast(lake)
    else:
        converted = column.cast(lake)
    return converted.alias(m.name)


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
