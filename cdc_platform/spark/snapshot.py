"""A snapshot generation: one consistent, parallel read of a source table into Delta.

Order matters for correctness:
1. the **watermark** (source LSN, then Kafka end offsets) is taken *before* the snapshot,
   so every transaction committed after the watermark is either in the snapshot or not,
   and is in the changelog after the watermark either way — re-applying a full row image
   that the snapshot already holds changes nothing, missing one would lose it;
2. a coordinator transaction (REPEATABLE READ) exports its MVCC snapshot, and every
   Spark JDBC partition joins it (``SET TRANSACTION SNAPSHOT``): all partitions see one
   consistent state, and the coordinator counts the rows of that same state;
3. Spark reads the partitions in parallel (ranges of a numeric key, hash buckets
   otherwise), converts to lake types and writes a Delta table for the generation;
4. written rows must equal the coordinator's count, or the generation fails.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg import sql

from cdc_platform.capture.pg_catalog import SourceTable, describe_table, resolve_key, resolve_pg_types
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.envelope.lsn import format_lsn, parse_lsn
from cdc_platform.spark.lake_types import SnapshotColumn, quote_ident, snapshot_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import ArrayType

log = logging.getLogger("cdc_platform.snapshot")

ROWS_PER_PARTITION = 250_000
PROGRESS_INTERVAL_S = 10.0
NUMERIC_KINDS = {"int16", "int32", "int64"}


class SnapshotError(RuntimeError):
    pass


@dataclass(frozen=True)
class Watermark:
    """Where the source and Kafka stood just before the snapshot was taken."""

    lsn: int
    kafka_end_offsets: dict[int, int]  # Kafka partition -> end offset (next offset to be written)
    taken_at: str

    def as_dict(self) -> dict[str, Any]:
        return {"lsn": format_lsn(self.lsn), "kafka_end_offsets": self.kafka_end_offsets, "taken_at": self.taken_at}


@dataclass
class SnapshotResult:
    generation: str
    path: str
    rows: int
    source_rows: int
    bytes: int
    watermark: Watermark
    duration_s: float
    schema_hash: str
    spark_partitions: int
    key_columns: tuple[str, ...]
    columns: list[tuple[str, str]] = field(default_factory=list)  # (name, lake type)


def table_root(config: PlatformConfig, table: TableConfig) -> str:
    return f"{config.lake.root.rstrip('/')}/{table.source}/{table.dagster_name}"


def snapshot_path(config: PlatformConfig, table: TableConfig, generation: str) -> str:
    return f"{table_root(config, table)}/snapshot/{generation}"


def kafka_end_offsets(config: PlatformConfig, topic: str) -> dict[int, int]:
    """End offset per partition of ``topic`` ({} if the topic does not exist yet)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config.kafka.client_config(), "group.id": "cdc_platform_watermark"})
    try:
        metadata = consumer.list_topics(topic, timeout=15)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in sorted(found.partitions)
        }
    finally:
        consumer.close()


def source_conninfo(config: PlatformConfig, table: TableConfig) -> str:
    """libpq connection string for the table's source (holds the password: never log it)."""
    return config.postgres(table.source).conninfo(table.source, "cdc_platform_snapshot")


class SparkProgress(threading.Thread):
    """Logs the running Spark job's progress (tasks done of tasks, and the share of the
    table that represents) every ``interval_s`` while a long read/write runs."""

    def __init__(
        self, spark: SparkSession, label: str, rows: int, log_progress: Callable[[str], None], interval_s: float = 10.0
    ) -> None:
        super().__init__(daemon=True)
        self.spark, self.label, self.rows, self.log_progress, self.interval_s = (
            spark,
            label,
            rows,
            log_progress,
            interval_s,
        )
        self._done = threading.Event()

    def run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._done.wait(self.interval_s):
            total = done = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    total += info.numTasks
                    done += info.numCompletedTasks
            if total:
                share = done / total
                approx = int(self.rows * share)
                self.log_progress(
                    f"{self.label}: {done}/{total} Spark tasks done ({share:.0%}, ~{approx} of {self.rows} rows)"
                )

    def stop(self) -> None:
        self._done.set()


def plan_predicates(
    conn: psycopg.Connection[tuple[Any, ...]], described: SourceTable, key: tuple[str, ...], kinds: dict[str, str],
    source_rows: int, max_partitions: int,
) -> list[str]:  # fmt: skip
    """WHERE clauses splitting the table into disjoint parts that cover it."""
    partitions = max(1, min(max_partitions, -(-source_rows // ROWS_PER_PARTITION)))
    first = key[0]
    ident = quote_ident(first)
    if partitions == 1:
        return ["TRUE"]
    if kinds[first] in NUMERIC_KINDS:
        query = sql.SQL("SELECT min({k}), max({k}) FROM {s}.{t}").format(
            k=sql.Identifier(first), s=sql.Identifier(described.schema), t=sql.Identifier(described.name)
        )
        row = conn.execute(query).fetchone()
        assert row is not None
        low, high = int(row[0] or 0), int(row[1] or 0)
        step = max(1, -(-(high - low + 1) // partitions))
        bounds = list(range(low, high + 1, step))
        preds = [f"{ident} >= {b} AND {ident} < {b + step}" for b in bounds]
        return preds
    # hash buckets for non-numeric keys (uuid, text, …); the bigint cast avoids abs() overflow
    return [
        f"((hashtext({ident}::text)::bigint % {partitions}) + {partitions}) % {partitions} = {i}"
        for i in range(partitions)
    ]


def take_snapshot(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    generation: str,
    log_progress: Callable[[str], None] = log.info,
) -> SnapshotResult:
    from pyspark.sql import functions as F

    if config.is_polled(table):
        from cdc_platform.spark.jdbc_snapshot import take_jdbc_snapshot

        return take_jdbc_snapshot(spark, config, table, generation, log_progress)
    started = time.monotonic()
    conninfo = source_conninfo(config, table)
    topic = config.topic_for(table)
    with psycopg.connect(conninfo, autocommit=True) as coordinator:
        # 1. watermark first (see the module docstring)
        row = coordinator.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        watermark = Watermark(parse_lsn(str(row[0])), kafka_end_offsets(config, topic), datetime.now(UTC).isoformat())
        # 2. one MVCC snapshot for every reader
        coordinator.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        exported = coordinator.execute("SELECT pg_export_snapshot()").fetchone()
        assert exported is not None
        snapshot_id = str(exported[0])
        described = describe_table(coordinator, table.schema_name, table.table_name)
        key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
        types = resolve_pg_types(coordinator, [c.type_oid for c in described.columns])
        columns = [snapshot_column(c.name, types[c.type_oid], c.type_modifier, c.dims) for c in described.columns]
        count_query = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(described.schema), sql.Identifier(described.name)
        )
        counted = coordinator.execute(count_query).fetchone()
        source_rows = int(counted[0]) if counted else 0
        kinds = {c.name: types[c.type_oid].kind for c in described.columns}
        max_partitions = max(1, spark.sparkContext.defaultParallelism * 2)
        predicates = plan_predicates(coordinator, described, key, kinds, source_rows, max_partitions)
        log_progress(
            f"{table.key}: snapshot {generation}: {source_rows} rows at watermark {format_lsn(watermark.lsn)}, "
            f"{len(predicates)} Spark partition(s)"
        )
        # 3. parallel read in the exported snapshot
        frame = _read(spark, config, table, described, columns, predicates, snapshot_id)
        path = snapshot_path(config, table, generation)
        # the watermark travels with the data (the commit's userMetadata): current reads it there
        progress = SparkProgress(
            spark, f"{table.key}: snapshot {generation}", source_rows, log_progress, PROGRESS_INTERVAL_S
        )
        progress.start()
        try:
            generation_info = {
                "generation": generation,
                "watermark_lsn": watermark.lsn,
                "key_columns": list(key),
                **watermark.as_dict(),
            }
            frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
                "userMetadata", json.dumps(generation_info)
            ).save(path)
        finally:
            progress.stop()
        coordinator.execute("COMMIT")

    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().select("sizeInBytes").first()
    written = spark.read.format("delta").load(path).agg(F.count(F.lit(1)).alias("n")).first()
    rows = int(written["n"]) if written else 0
    # 4. the generation must hold exactly what the snapshot saw
    if rows != source_rows:
        raise SnapshotError(
            f"{table.key}: snapshot {generation} wrote {rows} rows but the source had {source_rows} in the "
            "same MVCC snapshot; the generation is incomplete and must not be used"
        )
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
        columns=[(c.name, c.lake.simpleString()) for c in columns],
    )
    log_progress(
        f"{table.key}: snapshot {generation}: wrote {rows} rows ({result.bytes} bytes) in {result.duration_s} s"
    )
    return result


def _read(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    described: SourceTable,
    columns: list[SnapshotColumn],
    predicates: list[str],
    snapshot_id: str,
) -> DataFrame:
    from pyspark.sql import functions as F

    src = config.postgres(table.source)
    query = "(SELECT {} FROM {}.{}) AS snapshot_source".format(
        ", ".join(c.select_sql for c in columns), quote_ident(described.schema), quote_ident(described.name)
    )
    # every partition's connection joins the coordinator's snapshot, with the session
    # settings that make text forms unambiguous (the same as capture's)
    init = (
        "SET TimeZone = 'UTC'; SET IntervalStyle = 'iso_8601'; SET extra_float_digits = 1; "
        f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
    )
    properties = {
        "user": src.user,
        "password": src.password(table.source).get_secret_value(),
        "driver": "org.postgresql.Driver",
        "fetchsize": "10000",
        "sessionInitStatement": init,
        "preferTimestampNTZ": "true",
        "ApplicationName": "cdc_platform_snapshot",
        **{k: v for k, v in src.connect_options.items() if k in ("sslmode", "connect_timeout")},
    }
    url = f"jdbc:postgresql://{src.host}:{src.port}/{src.database}"
    frame = spark.read.jdbc(url=url, table=query, predicates=predicates, properties=properties)

    def column(name: str) -> Any:
        return F.col("`" + name.replace("`", "``") + "`")

    return frame.select(
        *[
            (
                F.from_json(column(c.name), cast("ArrayType", c.lake)) if c.from_json else column(c.name).cast(c.lake)
            ).alias(c.name)
            for c in columns
        ]
    )


def list_generations(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> list[str]:
    """Generation directories under snapshot/ (via Hadoop's FileSystem: local or object storage)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    root = jvm.org.apache.hadoop.fs.Path(f"{table_root(config, table)}/snapshot")
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(root):
        return []
    return sorted(s.getPath().getName() for s in fs.listStatus(root) if s.isDirectory())


def generation_info(spark: SparkSession, path: str) -> dict[str, Any]:
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    for entry in reversed(history):
        if entry["userMetadata"]:
            return dict(json.loads(entry["userMetadata"]))
    raise SnapshotError(f"snapshot {path} has no watermark in its commit metadata; take a new generation")


@contextmanager
def scratch_snapshot(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, purpose: str
) -> Iterator[SnapshotResult]:
    """A consistent read of the source into a throwaway Delta table under the lake
    (``_scratch/``), removed afterwards: what checks and ``verify`` compare current with."""
    import uuid

    root = f"{config.lake.root.rstrip('/')}/_scratch/{purpose}-{uuid.uuid4().hex[:8]}"
    scratch = config.model_copy(update={"lake": config.lake.model_copy(update={"root": root})})
    try:
        yield take_snapshot(spark, scratch, table, purpose, log_progress=lambda _msg: None)
    finally:
        remove_path(spark, root)


def remove_path(spark: SparkSession, path: str) -> None:
    """Delete a lake directory: local paths directly, other URIs through Hadoop's FileSystem."""
    import shutil

    if "://" not in path or path.startswith("file:"):
        shutil.rmtree(path.removeprefix("file:"), ignore_errors=True)
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    target = jvm.org.apache.hadoop.fs.Path(path)
    target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(target, True)
