"""The data checks behind the Dagster asset checks: keys, schema compatibility, completeness.

Each returns a report (numbers, samples of offending keys or columns, a verdict); the
Dagster edge turns it into an ``AssetCheckResult``.

* **keys** — current: no key column null, no key twice. Changelog (recent windows):
  every Kafka key holds exactly the key columns, and one row always has the same key text.
* **schema** — ``lake/schema_registry.py``; pandera schemas generated from the table's
  schema validate current (types, nullability, key columns).
* **completeness** — recorded changelog ranges cover every offset from the generation's
  watermark (no holes, ``model.coverage``); dead letters per window within
  ``errors.dead_letter_threshold``; and, when the position allows an exact comparison,
  current reconciles with the source (row count and an order-independent checksum of
  all columns; samples of missing/extra keys). Exact means: capture has confirmed
  everything the source had committed when it was read, current has applied everything
  in Kafka, and nothing applied is newer than the read. A source that cannot see hard
  deletes (polling) has its keys compared instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.lake_types import lake_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.snapshot import read_jdbc, scratch_copy
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import behind, walk
from cdc_platform.model.generations import Generation
from cdc_platform.model.tables import TableSchema
from cdc_platform.sources.base import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SAMPLE = 5
RECENT_WINDOWS = 3
CAPTURE_WAIT_S = 15.0


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


def check_keys(current: DataFrame, changelog: DataFrame | None, keys: list[str]) -> KeysReport:
    from pyspark.sql import functions as F

    any_null = F.lit(False)
    for k in keys:
        any_null = any_null | F.col(f"`{k}`").isNull()
    stats = current.agg(F.count(F.lit(1)).alias("rows"), F.sum(any_null.cast("int")).alias("nulls")).first()
    assert stats is not None
    duplicates = current.groupBy(*[f"`{k}`" for k in keys]).count().where("count > 1")
    sample = key_samples(duplicates, keys, "duplicate")
    if stats["nulls"]:
        sample += key_samples(current.where(any_null), keys, "null")
    report = KeysReport(int(stats["rows"]), int(stats["nulls"] or 0), duplicates.count(), sample)
    if changelog is not None:
        _check_kafka_keys(changelog, keys, report)
    return report


def _check_kafka_keys(changelog: DataFrame, keys: list[str], report: KeysReport) -> None:
    from pyspark.sql import functions as F

    events = changelog.where(F.col("op").isNotNull() & (F.col("op") != "t"))
    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    fields = F.array_sort(F.json_object_keys("key_json"))
    expected = F.array_sort(F.array(*[F.lit(k) for k in keys]))
    keyed = events.select(
        *[image[k].alias(f"__k_{k}") for k in keys], "key_json", (fields != expected).alias("wrong_fields")
    )
    summary = keyed.agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("wrong_fields").cast("int")).alias("wrong")).first()
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


def recent_changelog(spark: SparkSession, ledger: Ledger, table: LakeTable) -> DataFrame | None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, table.changelog_path):
        return None
    windows = sorted(ledger.windows(table.key))[-RECENT_WINDOWS:]
    return spark.read.format("delta").load(table.changelog_path).where(F.col("window_start").isin(windows))


# ---------------------------------------------------------------- schema (pandera)


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
    # sources that cannot see hard deletes: keys current holds that the source no longer has
    deleted_in_source: int = 0

    @property
    def passed(self) -> bool:
        return (
            not self.holes
            and self.max_dead_letters_per_window <= self.dead_letter_threshold
            and (not self.compared or (self.checksum_equal and not self.missing and not self.extra))
        )


@dataclass(frozen=True)
class CompletenessInputs:
    """What the completeness check compares: current as applied, and where it stands."""

    current: DataFrame
    committed: Generation
    frontier: dict[int, int]
    applied_position: int


def check_completeness(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    inputs: CompletenessInputs,
) -> CompletenessReport:  # fmt: skip
    watermark = inputs.committed.watermark
    start = watermark.kafka_end_offsets if watermark else {}
    ranges = [r.offsets for rs in ledger.windows(table.key).values() for r in rs]
    coverage = walk(start, ranges)
    dead, worst = _dead_letters(spark, table)
    report = CompletenessReport(
        [h.describe() for h in coverage.holes], coverage.offsets_missing, dead, worst,
        table.config.errors.dead_letter_threshold, False, "", inputs.current.count(),
    )  # fmt: skip
    if source.capabilities.sees_hard_deletes:
        _reconcile(spark, source, kafka, table, inputs, report)
    else:
        _hard_deletes(spark, source, table, inputs, report)
    return report


def _dead_letters(spark: SparkSession, table: LakeTable) -> tuple[int, int]:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table.dead_letters_path):
        return 0, 0
    per_window = spark.read.format("delta").load(table.dead_letters_path).groupBy("window_start").count().collect()
    return sum(int(r["count"]) for r in per_window), max((int(r["count"]) for r in per_window), default=0)


def _hard_deletes(
    spark: SparkSession, source: Source, table: LakeTable, inputs: CompletenessInputs, report: CompletenessReport
) -> None:
    """Polling cannot see hard deletes: compare current's keys with the source's. A key in
    current and not in the source was deleted there (rows the poller has not reached yet
    are the other way round: in the source, not yet in current)."""
    schema = TableSchema.from_json(inputs.committed.schema_json)
    keys = schema.key
    types = {c.name: lake_type(c.pgtype, c.typmod, c.dims) for c in schema.columns if c.name in keys}
    source_keys = read_jdbc(spark, source.key_read(table.config, keys), types)
    report.deleted_in_source, report.sample = keys_only_in(inputs.current, source_keys, list(keys), "deleted in source")
    report.compare_note = (
        "polled source: keys compared with the source; rows it hard-deleted stay in current until the next "
        "reconciliation generation (poll.reconcile_every, or cdc-platform rehydrate) drops them"
    )


def _reconcile(
    spark: SparkSession, source: Source, kafka: KafkaClients, table: LakeTable, inputs: CompletenessInputs,
    report: CompletenessReport,
) -> None:  # fmt: skip
    if unapplied := behind(inputs.frontier, kafka.end_offsets(table.topic)):
        report.compare_note = f"Kafka holds {unapplied} offsets current has not applied yet"  # cheap test first
        return
    with scratch_copy(spark, source, kafka, table, "reconcile") as (truth, plan):
        read_at = plan.watermark.position  # read just before the source snapshot began
        after_read = source.position()
        if source.wait_until_captured(after_read, time.monotonic() + CAPTURE_WAIT_S):
            report.compare_note = "capture has not confirmed everything the source had committed; compare later"
            return
        if unapplied := behind(inputs.frontier, kafka.end_offsets(table.topic)):
            report.compare_note = f"Kafka holds {unapplied} offsets current has not applied yet"
            return
        if inputs.applied_position > read_at:
            report.compare_note = "current applied changes newer than the source read; compare when quiet"
            return
        _compare(truth, inputs.current, list(plan.schema.key), report)


def _compare(source: DataFrame, current: DataFrame, keys: list[str], report: CompletenessReport) -> None:
    from pyspark.sql import functions as F

    columns = list(source.columns)
    mine = current.select(*[f"`{c}`" for c in columns])
    checksum = F.sum(F.xxhash64(*[F.col(f"`{c}`") for c in columns]).cast("decimal(38,0)"))
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
        report.sample = key_samples(missing, keys, "missing") + key_samples(extra, keys, "extra")


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
