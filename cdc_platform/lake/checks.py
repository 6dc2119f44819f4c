"""The data checks behind the Dagster asset checks: keys, schema compatibility, completeness.

Each returns a report (numbers, samples of offending keys or columns, a verdict); the
Dagster edge turns it into an ``AssetCheckResult``.

* **keys** — current: no key column null, no key twice. Changelog (its most recent
  records since the committed generation's watermark, ``RECENT_RECORDS`` per Kafka
  partition, windowed or streamed): every Kafka key holds exactly the key columns, one
  row always has the same key text, and each record (partition, offset), the changelog's
  own key, is in it once.
* **schema** — ``lake/schema_registry.py``; pandera schemas generated from the table's
  schema validate current (types, nullability, key columns).
* **completeness** — recorded changelog ranges cover every offset from the generation's
  watermark (no holes, ``model.coverage``); dead letters per changelog partition (window
  or day) within ``errors.dead_letter_threshold``; the topic is fed (``model.feeds``: the source's own
  count of rows written moved, the producer confirmed past it, and the topic got
  nothing is a failure naming the likely cause); and current reconciles with one
  consistent read of the source, row by row (rows compared, missing, extra, differing,
  with samples), leaving out only the keys with an event in the Kafka span the read
  cannot pin (``model.coverage.in_flight_ranges``), so busy tables get a verdict too.
  A source that cannot see hard deletes (polling) is compared the same way, its rows
  only current holds counted as hard deletes (a warning); with its poller stopped, only
  its keys are compared. A key the source holds twice fails either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import copies_of_each_record
from cdc_platform.lake.compare import SAMPLE, compare_at_one_read, key_samples, keys_only_in, repeated_keys
from cdc_platform.lake.dead_letters import count_dead_letters, read_dead_letters
from cdc_platform.lake.lake_types import lake_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.snapshot import read_jdbc
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import walk
from cdc_platform.model.feeds import FeedObservation, feed_verdict
from cdc_platform.model.generations import Generation
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import changelog_partition
from cdc_platform.sources.base import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# per Kafka partition, the changelog's last records the keys check reads: bounded whatever the
# table's rate, and a batch or window's worth however small its batches
RECENT_RECORDS = 20_000
CAPTURE_WAIT_S = 15.0


def capture_wait_s(source: Source) -> float:
    """How long a check waits for capture to confirm its read of the source: 15 s, or twice
    the longest a running capture leaves a quiet table unconfirmed when that is longer. A
    poller records a quiet table every 10 s plus three polls (25 s at the default 5 s
    interval), so 15 s called a running poller silent, and the check warned "rows not
    compared" (a CI run did, under load, at 0.2 s polls)."""
    return max(CAPTURE_WAIT_S, 2 * source.confirms_within_s())


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
    changelog_records_twice: int = 0  # Kafka records (partition, offset) in the changelog more than once
    kafka_sample: list[str] = field(default_factory=list)

    @property
    def current_passed(self) -> bool:
        """Current's own keys: what downstream readers rely on (the blocking check)."""
        return not (self.null_keys or self.duplicate_keys)

    @property
    def changelog_passed(self) -> bool:
        """The topic's keys and the changelog's records: wrong there, current can still be
        right, so a finding here warns about the next rehydration and the changelog's readers
        without stopping current's."""
        return not (self.kafka_key_mismatches or self.kafka_unstable_rows or self.changelog_records_twice)

    @property
    def passed(self) -> bool:
        return self.current_passed and self.changelog_passed


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
    twice = copies_of_each_record(changelog).where("copies > 1")
    report.changelog_records_twice = twice.count()
    report.kafka_sample = (
        [r["key_json"] for r in keyed.where("wrong_fields").limit(SAMPLE).collect()]
        + [" vs ".join(r["seen"]) for r in unstable.limit(SAMPLE).collect()]
        + [
            f"partition {r['kafka_partition']} offset {r['kafka_offset']} {r['copies']} times in the changelog"
            for r in twice.limit(SAMPLE).collect()
        ]
    )


def recent_changelog(spark: SparkSession, ledger: Ledger, table: LakeTable) -> DataFrame | None:
    """The changelog's last ``RECENT_RECORDS`` records of each Kafka partition the ledger
    recorded since the committed generation's watermark, by offset: the same for windowed
    and streamed changelogs. (It used to take the last three window keys, and a streamed
    changelog's partitions are days, not its batch keys: the keys check read nothing there
    and passed.)"""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, table.changelog_path):
        return None
    recorded = ledger.windows(table.key)
    ends: dict[int, int] = {}
    for ranges in recorded.values():
        for r in ranges:
            ends[r.partition] = max(ends.get(r.partition, r.end), r.end)
    committed = ledger.committed(table.key)
    start = committed.watermark.kafka_end_offsets if committed and committed.watermark else {}
    # only what the committed generation's current was built from: a new generation (after a
    # key change, or once another producer stopped) starts the check afresh
    since = {p: max(end - RECENT_RECORDS, start.get(p, 0)) for p, end in ends.items()}
    days = sorted({
        changelog_partition(key) for key, ranges in recorded.items()
        if any(r.end > max(r.start, since[r.partition]) for r in ranges)
    })  # fmt: skip
    in_span = F.lit(False)
    for partition, first in since.items():
        in_span = in_span | ((F.col("kafka_partition") == partition) & (F.col("kafka_offset") >= first))
    changelog = spark.read.format("delta").load(table.changelog_path)
    return changelog.where(F.col("window_start").isin(days) & in_span)


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
    dead_letters: int  # not marked examined (cdc-platform dead-letters --examined)
    max_dead_letters_per_window: int  # of those, the most in one changelog partition
    dead_letter_threshold: int
    compared: bool
    compare_note: str
    current_rows: int = 0
    source_rows: int = 0
    compared_rows: int = 0  # keys both sides hold, outside the in-flight span
    missing: int = 0  # rows in the source, not in current
    extra: int = 0  # in current, not in the source
    differing: int = 0  # in both, some column differs
    repeated: int = 0  # keys the source holds more than once: current keeps one row per key
    in_flight_keys: int = 0  # keys left out: changed in the span the read could not pin
    in_flight_offsets: int = 0
    sample: list[str] = field(default_factory=list)
    # sources that cannot see hard deletes: keys current holds that the source no longer has
    deleted_in_source: int = 0
    # is the topic fed? rows the source wrote, and events the topic got, since the last reading
    source_changes: int | None = None
    topic_events: int | None = None
    unfed: str = ""
    dead_letters_examined: int = 0

    def description(self, table: str, polled: bool) -> str | None:
        """What the check's result says beside its numbers: the cause and the fix."""
        if self.repeated:
            return (
                f"{self.repeated} key(s) are held by more than one source row, and current keeps one row per key, so "
                f"it lacks the others: key {table} on columns unique in the source (a primary key, or "
                "tables[].primary_key), then rehydrate"
            )
        if polled and self.compared and (self.missing or self.differing):
            return (
                f"{self.missing + self.differing} row(s) of current differ from the source: polling passed over their "
                "changes (a transaction that committed after a poll had read past its timestamp column: raise "
                "poll.timestamp_delay_s to cover the longest transaction; in incrementing mode, any update). A "
                f"reconciliation generation repairs current: cdc-platform rehydrate {table}"
            )
        if self.max_dead_letters_per_window > self.dead_letter_threshold:
            return (
                f"{self.dead_letters} dead letter(s) not examined, at most {self.max_dead_letters_per_window} in one "
                f"changelog partition (errors.dead_letter_threshold={self.dead_letter_threshold}): records that could "
                "not be decoded, kept with their raw bytes in the table's dead-letter table. Examine them "
                f"(cdc-platform dead-letters {table} lists where and why), then mark them examined (cdc-platform "
                f"dead-letters {table} --examined): the check counts only newer ones. The changes they carried reach "
                "current by a new generation (the rehydration sensor starts one when the row comparison finds "
                f"current differing; or cdc-platform rehydrate {table})"
            )
        if self.passed and self.deleted_in_source:
            return (
                f"{self.deleted_in_source} row(s) exist in current but no longer in the source (hard deletes, which "
                "polling cannot see); the next reconciliation generation drops them"
            )
        return self.unfed or None

    @property
    def passed(self) -> bool:
        return (
            not self.holes
            and not self.unfed
            and self.max_dead_letters_per_window <= self.dead_letter_threshold
            and not self.repeated
            and (not self.compared or not (self.missing or self.extra or self.differing))
        )


@dataclass(frozen=True)
class CompletenessInputs:
    """What the completeness check reads: current as applied (its row count, and its keys
    for a polled source; the row comparison pins its own version), and its generation."""

    current: DataFrame
    committed: Generation


def check_completeness(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    inputs: CompletenessInputs,
) -> CompletenessReport:  # fmt: skip
    watermark = inputs.committed.watermark
    start = watermark.kafka_end_offsets if watermark else {}
    ranges = [r.offsets for rs in ledger.windows(table.key).values() for r in rs]
    coverage = walk(start, ranges)
    dead = count_dead_letters(read_dead_letters(table.dead_letters_path), ledger.dead_letters_examined(table.key))
    report = CompletenessReport(
        [h.describe() for h in coverage.holes], coverage.offsets_missing, dead.total - dead.examined,
        dead.worst_partition, table.config.errors.dead_letter_threshold, False, "", dead_letters_examined=dead.examined,
    )  # fmt: skip
    if source.capabilities.sees_hard_deletes:
        written = source.rows_written(table.config)  # before the read: the wait below covers it
        captured = _reconcile(spark, ledger, source, kafka, table, report)
        if written is not None:
            check_feed(ledger, kafka, table, report, written, captured, source.unfed_cause(table.config))
    else:
        _reconcile_polled(spark, ledger, source, kafka, table, inputs, report)
    if not report.compared:  # a comparison counted the version it pinned
        report.current_rows = inputs.current.count()
    return report


def check_feed(
    ledger: Ledger, kafka: KafkaClients, table: LakeTable, report: CompletenessReport, written: int, captured: bool,
    cause: str,
) -> None:  # fmt: skip
    """Is the topic fed (``model.feeds``)? ``written`` is the source's rows-written counter,
    read before a source position the producer has confirmed when ``captured``; the
    topic's end offsets are read now; the reading is judged against the last confirmed
    one in the ledger. An unfed reading is not recorded, so the check keeps failing until
    the topic receives the table's changes."""
    now = FeedObservation(datetime.now(UTC), written, kafka.end_offsets(table.topic), captured)
    before = ledger.last_feed(table.key)
    verdict = feed_verdict(before, now)
    if verdict is not None:
        report.source_changes, report.topic_events = verdict.source_changes, verdict.topic_events
    if verdict is not None and verdict.unfed:
        assert before is not None
        report.unfed = f"topic {table.topic} is not fed: {verdict.describe(before.at)}; {cause}"
    elif captured and (before is None or (before.source_changes, dict(before.topic_end)) != (written, now.topic_end)):
        ledger.record_feed(table.key, now)


def _reconcile_polled(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    inputs: CompletenessInputs, report: CompletenessReport,
) -> None:  # fmt: skip
    """Polling: current against one read of the source row by row, as for log-based
    sources, so a change the cursor passed over (a transaction that committed after a poll
    read past its timestamp; an update in incrementing mode) is a differing row. Rows only
    current holds are the source's hard deletes, which polling cannot see: they count as
    ``deleted_in_source``, a warning the next reconciliation resolves. When no poll began
    after the read in time (the poller stopped), the keys are compared instead."""
    _reconcile(spark, ledger, source, kafka, table, report)
    if not report.compared:
        why = report.compare_note
        _hard_deletes(spark, source, table, inputs, report)
        report.compare_note = f"rows {why}; {report.compare_note}"
        return
    report.deleted_in_source, report.extra = report.extra, 0
    report.sample = [f"deleted in source{s[len('extra') :]}" if s.startswith("extra ") else s for s in report.sample]
    report.compare_note += (
        f"; polled source: the {report.deleted_in_source} row(s) only current holds were hard-deleted in the source "
        "and stay until the next reconciliation generation (poll.reconcile_every, or cdc-platform rehydrate)"
    )


def _hard_deletes(
    spark: SparkSession, source: Source, table: LakeTable, inputs: CompletenessInputs, report: CompletenessReport
) -> None:
    """Polling cannot see hard deletes: compare current's keys with the source's. A key in
    current and not in the source was deleted there (rows the poller has not reached yet
    are the other way round: in the source, not yet in current)."""
    schema = TableSchema.from_json(inputs.committed.schema_json)
    keys = schema.key
    types = {c.name: lake_type(c.pgtype, c.typmod, c.dims) for c in schema.columns if c.name in keys}
    # one read of the source's keys for both questions (two would also be two states of it)
    source_keys = read_jdbc(spark, source.key_read(table.config, keys), types).cache()
    try:
        report.deleted_in_source, deleted = keys_only_in(inputs.current, source_keys, list(keys), "deleted in source")
        report.repeated, repeated = repeated_keys(source_keys, list(keys))
    finally:
        source_keys.unpersist()
    report.sample = deleted + repeated
    report.compare_note = (
        "polled source: keys compared with the source; rows it hard-deleted stay in current until the next "
        "reconciliation generation (poll.reconcile_every, or cdc-platform rehydrate) drops them"
    )


def _reconcile(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    report: CompletenessReport,
) -> bool:  # fmt: skip
    """Current against one consistent read of the source, row by row, except the keys with
    an event in the span neither side is sure to hold (``lake.compare``): so a table that
    never stops changing, even while the stream apply merges, still gets a verdict, and a
    lost change to any other key is found. Cost: one source read per evaluation, plus
    decoding the in-flight span, capped by ``completeness.max_in_flight_offsets``. True
    when the producer confirmed a source position taken after the read."""
    cap = table.config.completeness.max_in_flight_offsets
    result = compare_at_one_read(
        spark, ledger, source, kafka, table, capture_wait_s(source), cap, stop_when_unread=True
    )
    report.in_flight_offsets, report.in_flight_keys = result.in_flight_offsets, result.in_flight_keys
    if result.rows is None:
        report.compare_note = result.note
        return result.confirmed
    rows = result.rows
    report.compared, report.source_rows, report.current_rows = True, result.source_rows, result.current_rows
    report.compared_rows, report.missing, report.extra, report.differing, report.repeated = (
        rows.compared, rows.missing, rows.extra, rows.differing, rows.repeated,
    )  # fmt: skip
    report.sample = rows.sample
    report.compare_note = (
        f"exact at one source read and current version {result.current_version}: {rows.compared} rows compared, "
        f"{result.in_flight_keys} keys with changes in flight left out ({result.in_flight_offsets} offsets)"
    )
    return True
