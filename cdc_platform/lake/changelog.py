"""Changelog windows: Kafka offset ranges fixed once (``model.windows``), read in parallel,
decoded with the table's registered schema, written idempotently, recorded in the ledger.

The lake side never asks the source to process records: the schema comes from the
ledger (registered with each generation). Only when records carry a column the
registered schema lacks (a schema change) is ``refresh_schema`` called, which asks the
source and registers the change if the table's compatibility mode allows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.config.model import ErrorTolerance
from cdc_platform.kafka.clients import KafkaClients, worker_options
from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.lake_types import row_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import LakeTable, table_options
from cdc_platform.model.errors import DeadLetterError, NoGenerationError, SchemaIncompatibleError
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import (
    BatchPlan,
    WindowPlan,
    WindowRange,
    changelog_partition,
    is_batch_key,
    neighbours,
    plan_window,
    window_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# given the columns a window's records carry that the registered schema lacks: the
# refreshed schema (registered), or None when the source does not know them either
SchemaRefresh = Callable[[set[str]], TableSchema | None]


@dataclass
class WindowResult:
    window_start: str
    ranges: list[WindowRange]
    reused_ranges: bool
    events: dict[str, int] = field(default_factory=dict)  # by op, plus "tombstone"
    dead_letters: int = 0
    rows: int = 0
    min_commit_lsn: int | None = None
    max_commit_lsn: int | None = None
    duration_s: float = 0.0
    schema_registered: bool = False  # the window brought a compatible schema change


def plan(ledger: Ledger, kafka: KafkaClients, table: LakeTable, start: datetime, end: datetime) -> WindowPlan:
    """The window's ranges: recorded ones for a re-run, else from Kafka's offsets."""
    recorded = ledger.windows(table.key)
    committed = ledger.committed(table.key)
    floor = committed.watermark.kafka_end_offsets if committed and committed.watermark else {}
    key, end_key = window_key(start), window_key(end)
    if key in recorded:
        return WindowPlan(key, recorded[key], reused=True)
    previous, following = neighbours(key, end_key, recorded)
    facts = kafka.window_facts(table.topic, start, end, set(previous), set(following))
    if not facts:
        from cdc_platform.model.errors import WindowNotClosedError

        raise WindowNotClosedError(f"topic {table.topic} does not exist yet (has capture run?)")
    grace = table.config.changelog.grace_s
    return plan_window(table.key, start, end, recorded, facts, datetime.now(UTC), grace, floor)


def materialize_window(
    spark: SparkSession, ledger: Ledger, kafka: KafkaClients, table: LakeTable, start: datetime, end: datetime,
    refresh_schema: SchemaRefresh | None = None,
) -> WindowResult:  # fmt: skip
    started = time.monotonic()
    schema = _registered_schema(ledger, table)
    window = plan(ledger, kafka, table, start, end)
    frame, registered = _read_window(spark, kafka, table, window, schema, refresh_schema)
    try:
        result = _write_window(spark, table, window, frame)
    finally:
        frame.unpersist()
    if not window.reused:  # fixed once, after the data: later runs reuse exactly these ranges
        ledger.record_window(table.key, window)
    result.schema_registered = registered
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def materialize_batch(
    spark: SparkSession, ledger: Ledger, table: LakeTable, kafka: KafkaClients, batch: BatchPlan,
    refresh_schema: SchemaRefresh | None = None,
) -> WindowResult:  # fmt: skip
    """A stream apply's micro-batch: the planned offsets decoded and appended to the
    changelog under the batch's Delta transaction version (a re-run after a crash writes
    nothing twice), then recorded as a changelog range set."""
    started = time.monotonic()
    schema = _registered_schema(ledger, table)
    window = batch.as_window(reused=False)
    frame, registered = _read_window(spark, kafka, table, window, schema, refresh_schema)
    try:
        result = _write_window(spark, table, window, frame, batch.number)
    finally:
        frame.unpersist()
    crash_point("apply.changelog_written")
    ledger.record_window(table.key, window)
    result.schema_registered = registered
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def _registered_schema(ledger: Ledger, table: LakeTable) -> TableSchema:
    schema = ledger.latest_schema(table.key)
    if schema is None:
        raise NoGenerationError(
            f"{table.key} has no registered schema (no committed generation): the changelog decodes with the "
            f"schema a generation registers; run: cdc-platform snapshot {table.key}"
        )
    return schema


def transaction_app_id(table: LakeTable) -> str:
    """The Delta ``txnAppId`` of a table's stream batches (``txnVersion`` = the batch number)."""
    return f"cdc_platform.apply.{table.key}"


def _read_window(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, window: WindowPlan, schema: TableSchema,
    refresh_schema: SchemaRefresh | None,
) -> tuple[DataFrame, bool]:  # fmt: skip
    """The window's change rows (cached), decoded with the registered schema, or with the
    refreshed one when records carry columns it lacks."""
    from pyspark.sql import functions as F

    frame = read_ranges(spark, kafka, table, window, schema).cache()
    unknown = {
        name for r in frame.select(F.explode("unknown_columns").alias("c")).distinct().collect() for name in [r["c"]]
    }
    if not unknown:
        return frame, False
    frame.unpersist()
    refreshed = refresh_schema(unknown) if refresh_schema is not None else None
    if refreshed is None or not unknown <= set(refreshed.names):
        raise SchemaIncompatibleError(
            f"window {window.key} of {table.key}: records carry column(s) {sorted(unknown)} that the registered "
            "schema does not have and that could not be registered (the source is unreachable, or the change is "
            f"incompatible under {table.config.compatibility.value}); nothing was written. A new generation "
            f"registers the source's schema: cdc-platform rehydrate {table.key}"
        )
    return read_ranges(spark, kafka, table, window, refreshed).cache(), True


def read_ranges(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, window: WindowPlan, schema: TableSchema
) -> DataFrame:
    from pyspark.sql import functions as F

    spans = [(r.partition, r.start, r.end) for r in window.ranges]
    partition = changelog_partition(window.key)
    return read_offsets(spark, kafka, table, spans, schema).withColumn("window_start", F.lit(partition))


def read_offsets(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, spans: list[tuple[int, int, int]],
    schema: TableSchema,
) -> DataFrame:  # fmt: skip
    """The decoded change rows of the table's topic in ``[partition, start, end)`` spans."""
    from cdc_platform.lake.kafka_source import KafkaRangeDataSource, change_schema

    spark.dataSource.register(KafkaRangeDataSource)
    options = {
        "topic": table.topic,
        "schema": schema.to_json(),
        "encoding": table.encoding.to_option(),
        "ranges": json.dumps([list(span) for span in spans]),
        **worker_options(kafka.kafka),
    }
    return spark.read.format("cdc_kafka_range").schema(change_schema(row_type(schema))).options(**options).load()


def _write_window(
    spark: SparkSession, table: LakeTable, window: WindowPlan, frame: DataFrame, batch: int | None = None
) -> WindowResult:
    """A window replaces its changelog partition; a stream batch (``batch``: its number)
    appends to its day's partition, idempotently (Delta ``txnAppId``/``txnVersion``)."""
    from pyspark.sql import functions as F

    dead = frame.where(F.col("error").isNotNull())
    dead_count = dead.count()
    if dead_count and table.config.errors.tolerance is ErrorTolerance.NONE:
        sample = [r["error"] for r in dead.select("error").limit(3).collect()]
        raise DeadLetterError(
            f"{'batch' if batch is not None else 'window'} {window.key} of {table.key}: {dead_count} record(s) "
            f"cannot be decoded (e.g. {sample}); errors.tolerance is 'none', so nothing was written. Fix the "
            "producer, or set errors.tolerance: all to send them to the dead-letter table"
        )
    good = frame.where(F.col("error").isNull()).drop("error", "raw_key", "raw_value", "unknown_columns")
    # mergeSchema: a column the source added (compatible change) joins the images
    writer = good.write.format("delta").option("mergeSchema", "true")
    _write_mode(writer, window, batch, table).options(**table_options(good.schema, partition_by=("window_start",)))
    writer.partitionBy("window_start").save(table.changelog_path)
    if dead_count or batch is None:  # a window's re-run must also replace its dead letters
        dead_writer = dead.select(
            "window_start", "kafka_partition", "kafka_offset", "kafka_timestamp", "error", "raw_key", "raw_value",
            F.lit(table.topic).alias("topic"),
        ).write.format("delta")  # fmt: skip
        _write_mode(dead_writer, window, batch, table).partitionBy("window_start").save(table.dead_letters_path)
    return _window_stats(window, good, dead_count)


def _write_mode(writer: Any, window: WindowPlan, batch: int | None, table: LakeTable) -> Any:
    if batch is None:
        assert not is_batch_key(window.key)
        return writer.mode("overwrite").option("replaceWhere", f"window_start = '{window.key}'")
    return writer.mode("append").option("txnAppId", transaction_app_id(table)).option("txnVersion", str(batch))


def _window_stats(window: WindowPlan, good: DataFrame, dead_count: int) -> WindowResult:
    """One pass: events by op and the window's commit-position span."""
    from pyspark.sql import functions as F

    stats = (
        good.groupBy(F.coalesce("op", F.lit("tombstone")).alias("op"))
        .agg(F.count(F.lit(1)).alias("n"), F.min("commit_lsn").alias("lo"), F.max("commit_lsn").alias("hi"))
        .collect()
    )
    events = {r["op"]: int(r["n"]) for r in stats}
    lows = [r["lo"] for r in stats if r["lo"] is not None]
    highs = [r["hi"] for r in stats if r["hi"] is not None]
    return WindowResult(
        window_start=window.key,
        ranges=list(window.ranges),
        reused_ranges=window.reused,
        events=events,
        dead_letters=dead_count,
        rows=sum(events.values()),
        min_commit_lsn=min(lows) if lows else None,
        max_commit_lsn=max(highs) if highs else None,
    )
