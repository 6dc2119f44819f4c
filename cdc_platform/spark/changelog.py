"""Changelog windows: Kafka offset ranges fixed once, read in parallel, written idempotently.

A window's range per Kafka partition is ``[start, end)``. It is decided the first time
the window is materialized and recorded in ``<table>/changelog_ranges``; re-runs reuse it.
``start`` is the recorded end of the window that ends where this one starts (if that one
is recorded), else
the first offset whose timestamp is at or after the window start; ``end`` is the
recorded start of the window just after (if recorded), else the first offset whose
timestamp is at or after the window end. So every offset belongs to exactly one window
even when record timestamps are not monotonic, and holes are checkable.

A window is **closed** — and only then materialized — when every partition has a record
at or after the window end, or the window end plus ``grace_s`` has passed (an idle
partition then ends at its current end offset).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cdc_platform.capture.catalog import describe_source
from cdc_platform.config import ErrorTolerance, PlatformConfig, TableConfig
from cdc_platform.envelope.changes import LakeColumnSpec
from cdc_platform.spark.snapshot import generation_info, list_generations, table_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class WindowNotClosedError(RuntimeError):
    """The window is still open: a partition has no record past its end and the grace
    period has not passed. Retry later (the changelog sensor only asks for closed ones)."""


class ChangelogGapError(RuntimeError):
    """Offsets the changelog needs are gone from Kafka: rehydrate (reason changelog_gap)."""

    reason = "changelog_gap"


class DeadLetterError(RuntimeError):
    """errors.tolerance is 'none' and the window holds records that cannot be decoded."""


@dataclass(frozen=True)
class OffsetRange:
    partition: int
    start: int
    end: int
    window_end: str = ""  # the window's end key: the next window starts there


@dataclass
class WindowResult:
    window_start: str
    ranges: list[OffsetRange]
    reused_ranges: bool
    events: dict[str, int] = field(default_factory=dict)  # by op, plus "tombstone"
    dead_letters: int = 0
    rows: int = 0
    min_commit_lsn: int | None = None
    max_commit_lsn: int | None = None
    duration_s: float = 0.0


def window_key(start: datetime) -> str:
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def changelog_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/changelog"


def ranges_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/changelog_ranges"


def dead_letters_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/dead_letters"


def recorded_ranges(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> dict[str, list[OffsetRange]]:
    from delta.tables import DeltaTable

    path = ranges_path(config, table)
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    out: dict[str, list[OffsetRange]] = {}
    for row in spark.read.format("delta").load(path).collect():
        out.setdefault(row["window_start"], []).append(
            OffsetRange(row["kafka_partition"], row["start_offset"], row["end_offset"], row["window_end"])
        )
    return {k: sorted(v, key=lambda r: r.partition) for k, v in out.items()}


def plan_window(
    config: PlatformConfig,
    table: TableConfig,
    start: datetime,
    end: datetime,
    recorded: dict[str, list[OffsetRange]],
    now: datetime | None = None,
    floor: dict[int, int] | None = None,
) -> tuple[list[OffsetRange], bool]:
    """The window's offset ranges, and whether they were already recorded. ``floor`` is the
    latest generation's watermark (Kafka end offsets): offsets below it that Kafka no
    longer has were needed only by older generations, so they are no hole."""
    from confluent_kafka import Consumer, TopicPartition

    key = window_key(start)
    if key in recorded:
        return recorded[key], True
    # neighbours by recorded boundaries, not by assumed sizes (a table's window size may change)
    previous = {r.partition: r.end for rs in recorded.values() for r in rs if r.window_end == key}
    following = {r.partition: r.start for r in recorded.get(window_key(end), [])}
    topic = config.topic_for(table)
    now = now or datetime.now(UTC)
    consumer = Consumer({**config.kafka.client_config(), "group.id": "cdc_platform_changelog_planner"})
    try:
        metadata = consumer.list_topics(topic, timeout=15)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise WindowNotClosedError(f"topic {topic} does not exist yet (has capture run?)")
        partitions = sorted(found.partitions)
        # look up by time only the edges that no recorded neighbour fixes already
        at_start = _offsets_for_time(consumer, topic, [p for p in partitions if p not in previous], start)
        at_end = _offsets_for_time(consumer, topic, [p for p in partitions if p not in following], end)
        ranges = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            first = previous[p] if p in previous else (at_start[p] if at_start[p] >= 0 else high)
            if p in following:
                last = following[p]
            elif at_end[p] >= 0:
                last = at_end[p]  # a record at or after the window end exists: closed
            elif now >= end + timedelta(seconds=table.changelog.grace_s):
                last = high  # idle partition past the grace period
            else:
                raise WindowNotClosedError(
                    f"window {key} of {table.key} is open: partition {p} has no record at or after "
                    f"{end.isoformat()} and the grace period ({table.changelog.grace_s:.0f} s) has not passed"
                )
            if first < low and (floor or {}).get(p, -1) >= low:
                first = max(first, (floor or {})[p])  # rehydrated past the hole
            if first < low:
                raise ChangelogGapError(
                    f"window {key} of {table.key}: {topic}[{p}] must start at offset {first}, but the earliest "
                    f"offset still in Kafka is {low} (retention or DeleteRecords removed the rest): the changelog "
                    "has a hole; the table must be rehydrated (new snapshot generation)"
                )
            ranges.append(OffsetRange(p, first, max(last, first), window_key(end)))
        return ranges, False
    finally:
        consumer.close()


def _offsets_for_time(consumer: Any, topic: str, partitions: list[int], when: datetime) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    if not partitions:
        return {}
    ms = int(when.timestamp() * 1000)
    found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in partitions], timeout=15)
    return {tp.partition: tp.offset for tp in found}


def lake_columns(config: PlatformConfig, table: TableConfig) -> list[LakeColumnSpec]:
    described, types = describe_source(config, table)
    return [LakeColumnSpec(c.name, types[c.type_oid], c.type_modifier, c.dims) for c in described.columns]


def source_options(config: PlatformConfig, table: TableConfig) -> dict[str, str]:
    """The Kafka range source's options: client settings (TLS/SASL included) without the
    secrets, which the workers read from their environment by name."""
    secret_keys = set(config.kafka.secret_options_env)
    client = {k: v for k, v in config.kafka.client_config(resolve_secrets=False).items() if k not in secret_keys}
    return {
        "topic": config.topic_for(table),
        "client_config": json.dumps(client),
        "secret_options_env": json.dumps(config.kafka.secret_options_env),
        "decimal_handling": config.sources[table.source].decimal_handling,
    }


def materialize_window(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, start: datetime, end: datetime
) -> WindowResult:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    from cdc_platform.spark.kafka_source import KafkaRangeDataSource, change_schema, columns_option
    from cdc_platform.spark.lake_types import lake_type

    started = time.monotonic()
    key = window_key(start)
    recorded = recorded_ranges(spark, config, table)
    generations = list_generations(spark, config, table)
    watermark = generation_info(spark, f"{table_root(config, table)}/snapshot/{generations[-1]}") if generations else {}
    floor = {int(p): int(o) for p, o in watermark.get("kafka_end_offsets", {}).items()}
    ranges, reused = plan_window(config, table, start, end, recorded, floor=floor)
    columns = lake_columns(config, table)
    row_type = StructType([StructField(c.name, lake_type(c.pgtype, c.typmod, c.dims), True) for c in columns])
    spark.dataSource.register(KafkaRangeDataSource)
    frame = (
        spark.read.format("cdc_kafka_range")
        .schema(change_schema(row_type))
        .options(**source_options(config, table))
        .option("ranges", json.dumps([[r.partition, r.start, r.end] for r in ranges]))
        .option("columns", columns_option(columns))
        .load()
        .withColumn("window_start", F.lit(key))
    ).cache()
    try:
        dead = frame.where(F.col("error").isNotNull())
        dead_count = dead.count()
        if dead_count and table.errors.tolerance is ErrorTolerance.NONE:
            sample = [r["error"] for r in dead.select("error").limit(3).collect()]
            raise DeadLetterError(
                f"window {key} of {table.key}: {dead_count} record(s) cannot be decoded (e.g. {sample}); "
                "errors.tolerance is 'none', so nothing was written. Fix the producer, or set "
                "errors.tolerance: all to send them to the dead-letter table"
            )
        good = frame.where(F.col("error").isNull()).drop("error", "raw_key", "raw_value")
        condition = f"window_start = '{key}'"
        # mergeSchema: a column the source added (compatible change) joins the images
        good.write.format("delta").mode("overwrite").option("replaceWhere", condition).option(
            "mergeSchema", "true"
        ).partitionBy("window_start").save(changelog_path(config, table))
        dead.select(
            "window_start", "kafka_partition", "kafka_offset", "kafka_timestamp", "error", "raw_key", "raw_value",
            F.lit(config.topic_for(table)).alias("topic"),
        ).write.format("delta").mode("overwrite").option("replaceWhere", condition).partitionBy("window_start").save(
            dead_letters_path(config, table)
        )  # fmt: skip
        if not reused:  # fixed once: later runs reuse exactly these ranges
            rows = [(key, r.window_end, r.partition, r.start, r.end, datetime.now(UTC)) for r in ranges]
            spark.createDataFrame(
                rows,
                "window_start string, window_end string, kafka_partition int, start_offset long, end_offset long, "
                "recorded_at timestamp",
            ).write.format("delta").mode("append").save(ranges_path(config, table))
        # one pass: events by op and the window's commit-LSN span
        stats = (
            good.groupBy(F.coalesce("op", F.lit("tombstone")).alias("op"))
            .agg(F.count(F.lit(1)).alias("n"), F.min("commit_lsn").alias("lo"), F.max("commit_lsn").alias("hi"))
            .collect()
        )
        events = {r["op"]: int(r["n"]) for r in stats}
        lows = [r["lo"] for r in stats if r["lo"] is not None]
        highs = [r["hi"] for r in stats if r["hi"] is not None]
        return WindowResult(
            window_start=key,
            ranges=ranges,
            reused_ranges=reused,
            events=events,
            dead_letters=dead_count,
            rows=sum(events.values()),
            min_commit_lsn=min(lows) if lows else None,
            max_commit_lsn=max(highs) if highs else None,
            duration_s=round(time.monotonic() - started, 3),
        )
    finally:
        frame.unpersist()
