"""The data checks behind the Dagster asset checks: keys, schema compatibility, completeness.

Each returns a report (numbers, samples of offending keys or columns, a verdict); the
Dagster edge turns it into an ``AssetCheckResult``.

* **keys** — current: no key column null, no key twice. Changelog (recent windows):
  every Kafka key holds exactly the key columns, and one row always has the same key text.
* **schema** — the source's schema compared with the table's registered schema history
  (``<table>/schema_history``) under its compatibility mode (``cdc_platform.schemas``);
  compatible changes are registered as a new version; a new generation starts a new
  baseline. Pandera schemas generated from the table's schema validate current and the
  changelog (types, nullability, key columns).
* **completeness** — recorded changelog ranges cover every offset from the generation's
  watermark (no holes); dead letters per window within ``errors.dead_letter_threshold``;
  and, when the position allows an exact comparison, current reconciles with the source
  (row count and an order-independent checksum of all columns; samples of missing/extra
  keys). Exact means: capture has confirmed everything the source had committed when it
  was read, current has applied everything in Kafka, and nothing applied is newer than
  the read. Otherwise the reconciliation reports that it could not compare, and why.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import psycopg

from cdc_platform.capture.catalog import describe_source
from cdc_platform.capture.mysql_catalog import schema_type_name
from cdc_platform.capture.pg_catalog import SourceColumn, resolve_key
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.schemas import ColumnVersion, SchemaChange, SchemaVersion, compare
from cdc_platform.spark.changelog import changelog_path, dead_letters_path, recorded_ranges
from cdc_platform.spark.snapshot import (
    generation_info,
    kafka_end_offsets,
    list_generations,
    scratch_snapshot,
    source_conninfo,
    table_root,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SAMPLE = 5
RECENT_WINDOWS = 3


# ---------------------------------------------------------------- keys


@dataclass
class KeysReport:
    rows: int
    null_keys: int
    duplicate_keys: int
    sample: list[str]
    kafka_events_checked: int = 0
    kafka_key_mismatches: int = 0  # keys whose fields are not exactly the key columns
    kafka_unstable_rows: int = 0  # rows seen with more than one key text
    kafka_sample: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.null_keys or self.duplicate_keys or self.kafka_key_mismatches or self.kafka_unstable_rows)


def check_keys(spark: SparkSession, current: DataFrame, changelog: DataFrame | None, keys: list[str]) -> KeysReport:
    from pyspark.sql import functions as F

    any_null = F.lit(False)
    for k in keys:
        any_null = any_null | F.col(k).isNull()
    stats = current.agg(F.count(F.lit(1)).alias("rows"), F.sum(any_null.cast("int")).alias("nulls")).first()
    assert stats is not None
    duplicates = current.groupBy(*keys).count().where("count > 1")
    duplicate_count = duplicates.count()
    sample = [json.dumps({k: plain_value(r[k]) for k in keys}) for r in duplicates.limit(SAMPLE).collect()]
    if stats["nulls"]:
        sample += [
            json.dumps({k: plain_value(r[k]) for k in keys}) for r in current.where(any_null).limit(SAMPLE).collect()
        ]
    report = KeysReport(int(stats["rows"]), int(stats["nulls"] or 0), duplicate_count, sample)
    if changelog is not None:
        events = changelog.where(F.col("op").isNotNull() & (F.col("op") != "t"))
        image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
        fields = F.array_sort(F.json_object_keys("key_json"))
        expected = F.array_sort(F.array(*[F.lit(k) for k in keys]))
        keyed = events.select(
            *[image[k].alias(f"__k_{k}") for k in keys], "key_json", (fields != expected).alias("wrong_fields")
        )
        summary = keyed.agg(
            F.count(F.lit(1)).alias("n"), F.sum(F.col("wrong_fields").cast("int")).alias("wrong")
        ).first()
        assert summary is not None
        unstable = (
            keyed.groupBy(*[f"__k_{k}" for k in keys])
            .agg(F.countDistinct("key_json").alias("texts"), F.collect_set("key_json").alias("seen"))
            .where("texts > 1")
        )
        report.kafka_events_checked = int(summary["n"])
        report.kafka_key_mismatches = int(summary["wrong"] or 0)
        report.kafka_unstable_rows = unstable.count()
        report.kafka_sample = [r["key_json"] for r in keyed.where("wrong_fields").limit(SAMPLE).collect()] + [
            " vs ".join(r["seen"]) for r in unstable.limit(SAMPLE).collect()
        ]
    return report


def recent_changelog(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> DataFrame | None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = changelog_path(config, table)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    windows = sorted(recorded_ranges(spark, config, table))[-RECENT_WINDOWS:]
    return spark.read.format("delta").load(path).where(F.col("window_start").isin(windows))


# ---------------------------------------------------------------- schema


@dataclass
class SchemaReport:
    version: int
    registered: bool  # a new version was registered by this check
    change: SchemaChange | None
    pandera_errors: list[str]
    compatibility: str
    observed: SchemaVersion | None = None  # the source schema this check read

    @property
    def passed(self) -> bool:
        return (self.change is None or self.change.compatible) and not self.pandera_errors


def schema_history_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/schema_history"


def observed_schema(config: PlatformConfig, table: TableConfig) -> SchemaVersion:
    described, _ = describe_source(config, table)
    key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
    polled = config.is_polled(table)

    def type_name(c: SourceColumn) -> str:
        return schema_type_name(c.type_oid, c.type_modifier) if polled else c.type_name

    return SchemaVersion(
        tuple(ColumnVersion(c.name, type_name(c), c.nullable, c.has_default) for c in described.columns), key
    )


def schema_history(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> list[dict[str, Any]]:
    from delta.tables import DeltaTable

    path = schema_history_path(config, table)
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in spark.read.format("delta").load(path).orderBy("version").collect()]


def _register(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    version: int,
    generation: str,
    schema: SchemaVersion,
    change: str,
) -> None:
    spark.createDataFrame(
        [(version, generation, schema.fingerprint(), schema.to_json(), change, datetime.now(UTC))],
        "version int, generation string, fingerprint string, schema string, change string, registered_at timestamp",
    ).write.format("delta").mode("append").save(schema_history_path(config, table))


def check_schema(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, generation: str, new_baseline: bool
) -> SchemaReport:
    """Compare the source's schema with the registered history (before anything is merged).

    ``new_baseline``: current is being rebuilt from a generation not yet registered; the
    generation read the source as it is, so its schema starts a new baseline."""
    observed = observed_schema(config, table)
    history = schema_history(spark, config, table)
    mode = table.compatibility.value
    if not history or (new_baseline and history[-1]["generation"] != generation):
        version = (history[-1]["version"] + 1) if history else 1
        _register(spark, config, table, version, generation, observed, "baseline of generation " + generation)
        return SchemaReport(version, True, None, [], mode, observed)
    latest = history[-1]
    if latest["fingerprint"] == observed.fingerprint():
        return SchemaReport(int(latest["version"]), False, None, [], mode, observed)
    change = compare(SchemaVersion.from_json(latest["schema"]), observed, table.compatibility)
    if not change.compatible:
        return SchemaReport(int(latest["version"]), False, change, [], mode, observed)
    version = int(latest["version"]) + 1
    _register(spark, config, table, version, generation, observed, change.summary())
    return SchemaReport(version, True, change, [], mode, observed)


def pandera_errors(frame: DataFrame, nullable: dict[str, bool], keys: list[str]) -> list[str]:
    """Validate a frame with a pandera schema generated from the table's schema: every
    column present with its lake type, NOT NULL columns without nulls, key columns present."""
    import pandera.pyspark as pa

    columns = {
        f.name: pa.Column(cast(Any, f.dataType), nullable=nullable.get(f.name, True) and f.name not in keys)
        for f in frame.schema.fields
        if not f.name.startswith("_cdc_")
    }
    validated = pa.DataFrameSchema(columns, strict=False).validate(frame)
    errors: list[str] = []
    accessor: Any = getattr(validated, "pandera")  # noqa: B009 - pandera's accessor, not a column
    for level in accessor.errors.values():
        for category in level.values():
            for problem in category:
                errors.append(f"{problem.get('column')}: {problem.get('check')} ({problem.get('error')})")
    return errors


# ---------------------------------------------------------------- completeness


@dataclass
class CompletenessReport:
    holes: list[str]
    offsets_missing: int
    dead_letters: int
    max_dead_letters_per_window: int
    dead_letter_threshold: int
    compared: bool
    compare_note: str
    current_rows: int = 0
    source_rows: int = 0
    missing: int = 0
    extra: int = 0
    checksum_equal: bool = True
    sample: list[str] = field(default_factory=list)
    # polled (jdbc) sources: keys current holds that the source no longer has (hard deletes)
    deleted_in_source: int = 0

    @property
    def passed(self) -> bool:
        return (
            not self.holes
            and self.max_dead_letters_per_window <= self.dead_letter_threshold
            and (not self.compared or (self.checksum_equal and not self.missing and not self.extra))
        )


def changelog_holes(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, watermark: dict[int, int]
) -> tuple[list[str], int]:
    """Offsets after the watermark that no recorded window covers, before a window that does."""
    ranges = [r for rs in recorded_ranges(spark, config, table).values() for r in rs]
    holes, missing = [], 0
    for partition in sorted({r.partition for r in ranges} | set(watermark)):
        position = watermark.get(partition, 0)
        for r in sorted((r for r in ranges if r.partition == partition), key=lambda r: r.start):
            if r.end <= position:
                continue
            if r.start > position:
                holes.append(f"partition {partition}: offsets {position}..{r.start - 1} in no window")
                missing += r.start - position
            position = max(position, r.end)
    return holes, missing


def check_completeness(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    current: DataFrame,
    frontier: dict[int, int],
    applied_commit_lsn: int | None,
) -> CompletenessReport:
    from delta.tables import DeltaTable

    generations = list_generations(spark, config, table)
    info = generation_info(spark, f"{table_root(config, table)}/snapshot/{generations[-1]}")
    watermark = {int(p): int(o) for p, o in info.get("kafka_end_offsets", {}).items()}
    holes, missing_offsets = changelog_holes(spark, config, table, watermark)
    dead, worst = 0, 0
    if DeltaTable.isDeltaTable(spark, dead_letters_path(config, table)):
        per_window = (
            spark.read.format("delta").load(dead_letters_path(config, table)).groupBy("window_start").count().collect()
        )
        dead = sum(int(r["count"]) for r in per_window)
        worst = max((int(r["count"]) for r in per_window), default=0)
    report = CompletenessReport(
        holes, missing_offsets, dead, worst, table.errors.dead_letter_threshold, False, "", current.count()
    )
    if config.is_polled(table):
        _hard_deletes(spark, config, table, current, info, report)
    else:
        _reconcile(spark, config, table, current, frontier, applied_commit_lsn, report)
    return report


def _hard_deletes(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    current: DataFrame,
    info: dict[str, Any],
    report: CompletenessReport,
) -> None:
    """Polling cannot see hard deletes: compare current's keys with the source's. A key in
    current and not in the source was deleted there (rows the poller has not reached yet
    are the other way round: in the source, not yet in current)."""
    from cdc_platform.spark.jdbc_snapshot import read_source_keys

    keys = list(info.get("key_columns") or table.primary_key or [])
    source = read_source_keys(spark, config, table, keys)
    report.deleted_in_source, report.sample = keys_only_in(current, source, keys, "deleted in source")
    report.compare_note = (
        "polled source: keys compared with the source; rows it hard-deleted stay in current until the next "
        "reconciliation generation (poll.reconcile_every, or cdc-platform rehydrate) drops them"
    )


def _reconcile(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    current: DataFrame,
    frontier: dict[int, int],
    applied_commit_lsn: int | None,
    report: CompletenessReport,
) -> None:
    from pyspark.sql import functions as F

    topic = config.topic_for(table)

    def unapplied() -> int:
        return sum(max(0, e - frontier.get(p, 0)) for p, e in kafka_end_offsets(config, topic).items())

    if behind := unapplied():  # cheap test first: then the O(table) read below cannot be compared
        report.compare_note = f"Kafka holds {behind} offsets current has not applied yet"
        return
    with scratch_snapshot(spark, config, table, "reconcile") as truth:
        confirmed, after_read = _wait_for_capture(config, table)
        behind = unapplied()  # again, after capture confirmed the read
        read_at = truth.watermark.lsn  # read just before the source snapshot began
        if confirmed < after_read:
            report.compare_note = "capture has not confirmed everything the source had committed; compare later"
            return
        if behind:
            report.compare_note = f"Kafka holds {behind} offsets current has not applied yet"
            return
        if applied_commit_lsn is not None and applied_commit_lsn > read_at:
            report.compare_note = "current applied changes newer than the source read; compare when quiet"
            return
        source = spark.read.format("delta").load(truth.path)
        columns = [c for c in source.columns]
        mine = current.select(*columns)
        checksum = F.sum(F.xxhash64(*[F.col(c) for c in columns]).cast("decimal(38,0)"))
        a = source.agg(F.count(F.lit(1)).alias("n"), checksum.alias("h")).first()
        b = mine.agg(F.count(F.lit(1)).alias("n"), checksum.alias("h")).first()
        assert a is not None and b is not None
        report.compared = True
        report.compare_note = "exact: capture confirmed the read position and current applied all of Kafka"
        report.source_rows, report.current_rows = int(a["n"]), int(b["n"])
        report.checksum_equal = a["h"] == b["h"] and a["n"] == b["n"]
        if not report.checksum_equal:
            missing, extra = source.exceptAll(mine), mine.exceptAll(source)
            report.missing, report.extra = missing.count(), extra.count()
            keys = list(truth.key_columns)
            report.sample = key_samples(missing, keys, "missing") + key_samples(extra, keys, "extra")


def _wait_for_capture(config: PlatformConfig, table: TableConfig, wait_s: float = 15.0) -> tuple[int, int]:
    """(capture's confirmed LSN, the source position just after the read): waits a little
    for a running capture to confirm past the read, as it does within a status interval."""
    from cdc_platform.envelope.lsn import parse_lsn

    deadline = time.monotonic() + wait_s
    with psycopg.connect(source_conninfo(config, table), autocommit=True) as conn:
        after_row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert after_row is not None
        after = parse_lsn(str(after_row[0]))
        while True:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                (config.slot_for(table.source),),
            ).fetchone()
            confirmed = parse_lsn(str(row[0])) if row and row[0] else 0
            # no capture streaming: waiting changes nothing
            if confirmed >= after or time.monotonic() > deadline or not row or row[1] is None:
                return confirmed, after
            time.sleep(0.5)


def plain_value(value: Any) -> Any:
    return value if isinstance(value, int | str | float | bool) or value is None else str(value)


def keys_only_in(frame: DataFrame, other: DataFrame, keys: list[str], label: str) -> tuple[int, list[str]]:
    """How many keys of ``frame`` ``other`` does not hold, with samples labelled ``label``."""
    only = frame.select(*[f"`{k}`" for k in keys]).join(other, keys, "left_anti").cache()
    try:
        return only.count(), key_samples(only, keys, label)
    finally:
        only.unpersist()


def key_samples(frame: DataFrame, keys: list[str], label: str) -> list[str]:
    """Up to SAMPLE rows of ``frame`` as '<label> {"key": value, …}' for check metadata."""
    return [f"{label} {json.dumps({k: plain_value(r[k]) for k in keys})}" for r in frame.limit(SAMPLE).collect()]
