"""Changelog windows: Kafka offset ranges fixed once (``model.windows``), read in parallel,
decoded with the table's registered schema, written idempotently, recorded in the ledger.

The lake side never asks the source to process records: the schema comes from the
ledger (registered with each generation). Only when records carry a column the
registered schema lacks (a schema change) is ``refresh_schema`` called, which asks the
source and registers the change if the table's compatibility mode allows it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.config.model import ErrorTolerance, KafkaConfig, read_secret
from cdc_platform.kafka.clients import KafkaClients, worker_options
from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.current import BatchSummary, appended_to
from cdc_platform.lake.driver_append import append_in_driver, spark_appends
from cdc_platform.lake.driver_batch import (
    DEAD,
    collected_records,
    collects_in_driver,
    fits_in_driver,
    kind_statistics,
    remember_held,
    within_driver,
)
from cdc_platform.lake.lake_types import row_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import LakeTable, table_options
from cdc_platform.model.coverage import holes_not_restarted
from cdc_platform.model.errors import (
    ChangelogGapError,
    DeadLetterError,
    FatalError,
    NoGenerationError,
    SchemaIncompatibleError,
)
from cdc_platform.model.generations import GenerationStatus
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import (
    BatchPlan,
    WindowPlan,
    WindowRange,
    changelog_partition,
    is_batch_key,
    neighbours,
    partition_coverage,
    plan_window,
    window_key,
)

log = logging.getLogger("cdc_platform.changelog")

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

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
    decoded = _decode(spark, kafka, table, window, schema, refresh_schema)
    try:
        result = _write_window(spark, table, window, decoded)
    finally:
        decoded.release()
    if not window.reused:  # fixed once, after the data: later runs reuse exactly these ranges
        ledger.record_window(table.key, window, result.rows + result.dead_letters)
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def materialize_batch(
    spark: SparkSession, ledger: Ledger, table: LakeTable, kafka: KafkaClients, batch: BatchPlan,
    refresh_schema: SchemaRefresh | None = None, retry: bool = False,
) -> DecodedBatch:  # fmt: skip
    """A stream apply's micro-batch: the planned offsets decoded and appended to the
    changelog with the batch's identity in the commit (``retry``: a batch an interrupted
    process planned; its append is skipped if it had committed), then recorded as a
    changelog range set. The decoded rows stay cached for the merge into current (the
    caller releases them): nothing is read back."""
    started = time.monotonic()
    schema = _registered_schema(ledger, table)
    window = batch.as_window(reused=False)
    decoded = _decode(spark, kafka, table, window, schema, refresh_schema)
    try:
        decoded.result = _write_window(spark, table, window, decoded, BatchWrite(batch.number, retry))
        crash_point("apply.changelog_written")
        ledger.record_window(table.key, window, decoded.result.rows + decoded.result.dead_letters)
    except BaseException:
        decoded.release()
        raise
    decoded.result.duration_s = round(time.monotonic() - started, 3)
    return decoded


@dataclass
class DecodedBatch:
    """A window's or batch's decoded records (cached) and what one pass over them found."""

    frame: DataFrame  # every record: change rows, tombstones, and errors (dead letters)
    events: dict[str, int]  # by op, plus "tombstone"
    dead_letters: int
    unknown_columns: set[str]
    summary: BatchSummary  # for the merge into current (and the window's commit positions)
    schema_registered: bool = False
    result: WindowResult | None = None
    python_rows: int = 0  # records Spark SQL left to the Python decoder (``jvm_decode``)
    held: list[DataFrame] = field(default_factory=list)  # cached frames ``frame`` is built on
    # the same records in the driver (a small stream batch, ``lake.driver_batch``): ``frame``
    # is built from them, and the driver's append and merge take them as they are
    arrow: pa.Table | None = None

    def changes(self) -> DataFrame:
        """The change events the merge applies (decoded, with an op)."""
        from pyspark.sql import functions as F

        return self.frame.where(F.col("error").isNull() & F.col("op").isNotNull())

    def changes_arrow(self) -> pa.Table | None:
        """``changes()`` in the driver, when the batch is held there."""
        import pyarrow.compute as pc

        if self.arrow is None:
            return None
        return self.arrow.filter(pc.and_(pc.is_null(self.arrow["error"]), pc.is_valid(self.arrow["op"])))

    def release(self) -> None:
        for frame in (self.frame, *self.held):
            frame.unpersist()


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


def _decode(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, window: WindowPlan, schema: TableSchema,
    refresh_schema: SchemaRefresh | None,
) -> DecodedBatch:  # fmt: skip
    """The window's records decoded (cached) with the registered schema, or with the
    refreshed one when records carry columns it lacks."""
    decoded = _read_decoded(spark, kafka, table, window, schema)
    _ensure_nothing_deleted(kafka, table, window, decoded)
    if not decoded.unknown_columns:
        return decoded
    decoded.release()
    unknown = decoded.unknown_columns
    refreshed = refresh_schema(unknown) if refresh_schema is not None else None
    if refreshed is None or not unknown <= set(refreshed.names):
        raise SchemaIncompatibleError(
            f"window {window.key} of {table.key}: records carry column(s) {sorted(unknown)} that the registered "
            "schema does not have and that could not be registered (the source is unreachable, or the change is "
            f"incompatible under {table.config.compatibility.value}); nothing was written. A new generation "
            f"registers the source's schema: cdc-platform rehydrate {table.key}"
        )
    again = _read_decoded(spark, kafka, table, window, refreshed)
    again.schema_registered = True
    return again


def _ensure_nothing_deleted(kafka: KafkaClients, table: LakeTable, window: WindowPlan, decoded: DecodedBatch) -> None:
    """Raise a changelog gap if retention or DeleteRecords may have removed records of the
    window before they were read. Spark's Kafka source skips missing offsets silently (it
    must: compaction leaves them), and a planned batch can wait long (its process died):
    without this, the batch would be recorded as applied with changes missing, and the
    frontier would move past the hole where the rehydration sensor looks for it. A topic's
    earliest offset only moves forward, so if every range still starts at or after it
    *after* the read, nothing of the window was deleted before or during the read."""
    earliest = {p: low for p, (low, _) in kafka.watermarks(table.topic).items()}
    lost = [(r.partition, r.start, earliest[r.partition]) for r in window.ranges
            if r.end > r.start and earliest.get(r.partition, 0) > r.start]  # fmt: skip
    if not lost:
        return
    decoded.release()
    detail = "; ".join(f"partition {p} from offset {start} (Kafka now starts at {low})" for p, start, low in lost)
    raise ChangelogGapError(
        f"{table.key}: records of {window.key} were deleted by retention or DeleteRecords before they were read: "
        f"{detail}; nothing of it was written. The changelog has a hole: the table needs a new generation "
        f"(the rehydration sensor starts one; or: cdc-platform rehydrate {table.key})"
    )


PYTHON = "__python"
NOT_IN_CHANGELOG = ("error", "raw_key", "raw_value", "unknown_columns")  # a dead letter's, or the decoder's


def _read_decoded(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, window: WindowPlan, schema: TableSchema
) -> DecodedBatch:
    """The window's records decoded and cached, with what one pass over them found. In the
    JVM, the records Spark SQL decodes exactly are cached as they come out of it, and only
    the others (usually none) go through the Python decoder: the common batch never leaves
    the JVM (the pass-through Arrow hop of ``decode_raw`` is for readers that do not cache)."""
    from pyspark.sql import functions as F

    if not decodes_in_jvm(table, kafka.kafka):
        return _decoded(read_ranges(spark, kafka, table, window, schema).cache())
    from cdc_platform.lake.jvm_decode import change_schema_of, exact_rows, jvm_decoded, python_decoded, read_raw

    spans = [(r.partition, r.start, r.end) for r in window.ranges]
    raw = read_raw(spark, kafka.kafka, table.topic, spans)
    if fits_in_driver(window, table):
        held = within_driver(
            table, f"a batch of {sum(r.end - r.start for r in window.ranges)} records",
            lambda: _decoded_in_driver(spark, jvm_decoded(raw, schema, table.encoding), schema, table, window),
        )  # fmt: skip
        if held is not None:
            return held  # else an estimate far too low: Spark's cached path below takes the batch
    rows = jvm_decoded(raw, schema, table.encoding).cache()
    columns = [*change_schema_of(schema).names, "window_start"]
    in_window = F.lit(changelog_partition(window.key))
    first = _decoded(rows.withColumn("window_start", in_window))
    if first.python_rows == 0:  # every record decoded in Spark SQL: the counts stand
        return replace(first, frame=first.frame.select(*columns), held=[rows])
    python = python_decoded(rows, schema, table.encoding).withColumn("window_start", in_window).cache()
    exact = exact_rows(rows, schema).withColumn("window_start", in_window)
    return replace(_decoded(exact.unionByName(python)), held=[rows, python])


def _decoded_in_driver(
    spark: SparkSession, rows: DataFrame, schema: TableSchema, table: LakeTable, window: WindowPlan
) -> DecodedBatch:
    """A small stream batch's records collected to the driver (``lake.driver_batch``), and a
    Spark frame of them for what Spark writes (no Kafka read again)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from cdc_platform.lake.jvm_decode import change_schema_of

    records, python_rows = collected_records(rows, schema, table.encoding)
    remember_held(table, records)
    partition = pa.array([changelog_partition(window.key)] * records.num_rows, pa.string())
    records = records.append_column("window_start", partition)
    frame_schema = T.StructType([*change_schema_of(schema).fields, T.StructField("window_start", T.StringType())])
    frame = spark.createDataFrame(records, schema=frame_schema)
    return replace(_batch_of(frame, kind_statistics(records), python_rows), arrow=records)


def _decoded(frame: DataFrame) -> DecodedBatch:
    """One Spark job over the cached records: counts by op, dead letters, columns the
    schema does not know, and the merge's summary (positions, time, newest truncate).
    Records a ``__jvm`` column marks for the Python decoder are only counted."""
    from pyspark.sql import functions as F

    kind = F.when(F.col("error").isNotNull(), F.lit(DEAD)).when(F.col("op").isNull(), F.lit("tombstone"))
    if "__jvm" in frame.columns:
        kind = F.when(~F.col("__jvm"), F.lit(PYTHON)).otherwise(kind.otherwise(F.col("op")))
    else:
        kind = kind.otherwise(F.col("op"))
    rows = (
        frame.groupBy(kind.alias("kind"))
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("commit_lsn").alias("lo"),
            F.max("commit_lsn").alias("hi"),
            F.max("source_ts").alias("ts"),
            F.min("source_ts").alias("ts_lo"),
            F.max(F.when(F.col("op") == "t", F.struct("commit_lsn", "lsn"))).alias("t"),
            F.array_distinct(F.flatten(F.collect_list("unknown_columns"))).alias("unknown"),
        )
        .collect()
    )
    python_rows = sum(int(r["n"]) for r in rows if r["kind"] == PYTHON)
    return _batch_of(frame, [r for r in rows if r["kind"] != PYTHON], python_rows)


def _batch_of(frame: DataFrame, rows: Sequence[Any], python_rows: int) -> DecodedBatch:
    """The batch from its statistics per kind of record (Spark's rows or
    ``driver_batch.kind_statistics``'s): counts by op, dead letters, unknown columns, and
    the merge's summary."""
    events = {r["kind"]: int(r["n"]) for r in rows if r["kind"] != DEAD}
    ops = [r for r in rows if r["kind"] not in (DEAD, "tombstone")]
    lows = [r["lo"] for r in ops if r["lo"] is not None]
    highs = [r["hi"] for r in ops if r["hi"] is not None]
    times = [r["ts"] for r in ops if r["ts"] is not None]
    first_times = [r["ts_lo"] for r in ops if r["ts_lo"] is not None]
    truncate = next(((int(r["t"]["commit_lsn"]), int(r["t"]["lsn"])) for r in ops if r["t"] is not None), None)
    summary = BatchSummary(
        changes=sum(int(r["n"]) for r in ops),
        max_commit=max(highs) if highs else None,
        min_commit=min(lows) if lows else None,
        max_ts=max(times).astimezone(UTC) if times else None,  # Spark hands back naive local time
        min_ts=min(first_times).astimezone(UTC) if first_times else None,
        truncate=truncate,
        deletes=events.get("d", 0),
    )
    return DecodedBatch(
        frame=frame,
        events=events,
        dead_letters=sum(int(r["n"]) for r in rows if r["kind"] == DEAD),
        unknown_columns={c for r in rows for c in (r["unknown"] or [])},
        summary=summary,
        python_rows=python_rows,
    )


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
    """The decoded change rows of the table's topic in ``[partition, start, end)`` spans:
    read and decoded in the JVM (``lake.jvm_decode``), or in Python workers."""
    from cdc_platform.lake.kafka_source import change_schema

    if decodes_in_jvm(table, kafka.kafka):
        from cdc_platform.lake.jvm_decode import decode_raw, read_raw

        return decode_raw(read_raw(spark, kafka.kafka, table.topic, spans), schema, table.encoding)
    _register_source(spark)
    options = {
        "topic": table.topic,
        "schema": schema.to_json(),
        "encoding": table.encoding.to_option(),
        "ranges": json.dumps([list(span) for span in spans]),
        **worker_options(kafka.kafka),
    }
    return spark.read.format("cdc_kafka_range").schema(change_schema(row_type(schema))).options(**options).load()


def decodes_in_jvm(table: LakeTable, kafka: KafkaConfig) -> bool:
    """Whether the table's records are read by Spark's Kafka source and decoded in Spark
    SQL (``apply.decoder``). Spark's Kafka client is Java's: librdkafka's TLS and SASL
    settings are translated where they have an exact counterpart (``kafka.java_client``);
    ``auto`` reads with librdkafka in Python workers when one has not."""
    if table.decoder == "python":
        return False
    blockers = java_client_blockers(kafka)
    if table.decoder == "jvm" and blockers:
        raise FatalError(
            f"{table.source}: apply.decoder is jvm, but {blockers}, which Spark's Java Kafka client cannot take as "
            "given; set apply.decoder: auto (or python) to read with confluent-kafka in Spark's Python workers"
        )
    return not blockers


def java_client_blockers(kafka: KafkaConfig) -> str:
    """What keeps the Kafka settings from Java's client, in words ('' when nothing does)."""
    from cdc_platform.kafka.java_client import jaas_safe, java_client_settings

    settings = java_client_settings(kafka.options, kafka.secret_options_env)
    if settings.unmapped:
        return f"kafka sets {list(settings.unmapped)}"
    unsafe = [
        env
        for env in settings.jaas_env
        if not jaas_safe(read_secret(env, "kafka.secret_options_env").get_secret_value())
    ]
    if unsafe:  # the value is not named: only that it holds a character JAAS would read
        return f"the secret in ${unsafe[0]} holds a double quote or a backslash"
    return ""


_REGISTERING = threading.Lock()
_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()  # sessions the Kafka range source is registered in


def _register_source(spark: SparkSession) -> None:
    """Once per session: a stream apply's tables decode side by side, and registering the
    same name from two threads at once fails."""
    from cdc_platform.lake.kafka_source import KafkaRangeDataSource

    with _REGISTERING:
        if spark not in _REGISTERED:
            spark.dataSource.register(KafkaRangeDataSource)
            _REGISTERED.add(spark)


def _write_window(
    spark: SparkSession, table: LakeTable, window: WindowPlan, decoded: DecodedBatch, batch: BatchWrite | None = None
) -> WindowResult:
    """A window replaces its changelog partition; a stream batch appends to its day's
    partition, its identity in the commit (``userMetadata``): a re-applied batch whose
    append had committed is not appended again (and the re-applied append also carries
    Delta's ``txnAppId``/``txnVersion``, which Delta itself refuses to commit twice)."""
    from pyspark.sql import functions as F

    frame = decoded.frame
    dead = frame.where(F.col("error").isNotNull())
    dead_count = decoded.dead_letters
    if dead_count and table.config.errors.tolerance is ErrorTolerance.NONE:
        sample = [r["error"] for r in dead.select("error").limit(3).collect()]
        raise DeadLetterError(
            f"{'batch' if batch is not None else 'window'} {window.key} of {table.key}: {dead_count} record(s) "
            f"cannot be decoded (e.g. {sample}); errors.tolerance is 'none', so nothing was written. Fix the "
            "producer, or set errors.tolerance: all to send them to the dead-letter table"
        )
    good = frame.where(F.col("error").isNull()).drop(*NOT_IN_CHANGELOG)
    if not _done_before(spark, table, table.changelog_path, batch) and not _appended_in_driver(
        spark, table, decoded, good, batch
    ):
        # mergeSchema: a column the source added (compatible change) joins the images
        writer = good.write.format("delta").option("mergeSchema", "true")
        options = {**table_options(good.schema, partition_by=("window_start",)), **appended_to(table)}
        _write_mode(writer, window, batch, table).options(**options).partitionBy("window_start").save(
            table.changelog_path
        )
    if (dead_count or batch is None) and not _done_before(spark, table, table.dead_letters_path, batch):
        # a window's re-run must also replace its dead letters
        dead_writer = dead.select(
            "window_start", "kafka_partition", "kafka_offset", "kafka_timestamp", "error", "raw_key", "raw_value",
            F.lit(table.topic).alias("topic"),
        ).write.format("delta")  # fmt: skip
        _write_mode(dead_writer, window, batch, table).partitionBy("window_start").save(table.dead_letters_path)
    events = dict(decoded.events)
    return WindowResult(
        window_start=window.key,
        ranges=list(window.ranges),
        reused_ranges=window.reused,
        events=events,
        dead_letters=dead_count,
        rows=sum(events.values()),
        min_commit_lsn=decoded.summary.min_commit,
        max_commit_lsn=decoded.summary.max_commit,
        schema_registered=decoded.schema_registered,
    )


def _appended_in_driver(
    spark: SparkSession, table: LakeTable, decoded: DecodedBatch, good: DataFrame, batch: BatchWrite | None
) -> bool:
    """A stream batch's rows (``good``) appended by delta-rs in the driver
    (``lake.driver_append``), or False: Spark appends."""
    import pyarrow.compute as pc

    held = decoded.arrow
    rows_in_batch = sum(decoded.events.values())
    if batch is None or spark_appends(spark, table, batch.number, batch.retry, rows_in_batch, held is not None):
        return False
    if held is None and not collects_in_driver(table, rows_in_batch):
        return False

    def rows() -> pa.Table:  # held in the driver already, or collected once delta-rs may write
        if held is None:
            collected = within_driver(table, f"the {rows_in_batch} rows of a batch", good.toArrow)
            if collected is None:
                raise _CollectRefused
            return collected
        return held.filter(pc.is_null(held["error"])).drop_columns(list(NOT_IN_CHANGELOG))

    identity, app_id = batch_identity(table, batch.number), transaction_app_id(table)
    try:
        return append_in_driver(table, rows, identity, app_id, batch.number)
    except _CollectRefused:  # before delta-rs wrote anything: Spark appends the batch
        return False


class _CollectRefused(Exception):
    """The driver could not take a batch's rows it collected for delta-rs' append (only that:
    an error once delta-rs may have written must not make Spark append the rows again)."""


def _done_before(spark: SparkSession, table: LakeTable, path: str, batch: BatchWrite | None) -> bool:
    return batch is not None and batch.retry and committed_before(spark, path, batch_identity(table, batch.number))


def _write_mode(writer: Any, window: WindowPlan, batch: BatchWrite | None, table: LakeTable) -> Any:
    if batch is None:
        assert not is_batch_key(window.key)
        return writer.mode("overwrite").option("replaceWhere", f"window_start = '{window.key}'")
    return writer.mode("append").options(**append_options(table, batch))


def append_options(table: LakeTable, batch: BatchWrite) -> dict[str, str]:
    """A stream batch's Delta append: its identity in the commit, and on a re-apply Delta's
    idempotent-write options too (Delta checks ``txnVersion`` by rebuilding the log's state:
    paid on a re-apply only)."""
    options = {"userMetadata": batch_identity(table, batch.number)}
    if batch.retry:
        options |= {"txnAppId": transaction_app_id(table), "txnVersion": str(batch.number)}
    return options


@dataclass(frozen=True)
class BatchWrite:
    """A stream batch's append: its number, and whether it is re-applied after an
    interruption (then the append may already be committed)."""

    number: int
    retry: bool = False


def batch_identity(table: LakeTable, number: int) -> str:
    """What a stream batch's Delta commit carries (``userMetadata``): the table and batch."""
    return f"{transaction_app_id(table)}#{number}"


RECENT_COMMITS = 20  # only the table's apply appends to it, and it waits for a pending batch


def committed_before(spark: SparkSession, path: str, identity: str) -> bool:
    """Whether a recent commit of the Delta table at ``path`` carries ``identity``: the
    append of a batch that was cut short after it committed."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return False
    history = DeltaTable.forPath(spark, path).history(RECENT_COMMITS).select("userMetadata").collect()
    return any(r["userMetadata"] == identity for r in history)


@dataclass(frozen=True)
class ChangelogDay:
    """A streamed changelog's UTC day: its offsets per Kafka partition, batches and events.
    While the day fills, a running apply adds each batch (``plus``); once the UTC day is
    over, ``seal_day`` reads the whole day back: its ranges fixed and checked contiguous.
    Days are the streamed changelog's partitions (in the lake and in Dagster): at most 366
    a year whatever the trigger interval."""

    table: str
    day: str  # the window key of the day's start, e.g. 2026-11-25T00:00:00Z
    batches: int = 0
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (first offset, end)
    events: dict[str, int] = field(default_factory=dict)  # by op, plus "tombstone"
    dead_letters: int = 0
    sealed: bool = False
    holes: tuple[str, ...] = ()  # offsets inside a sealed day that no batch covers (must be none)
    records_twice: int = 0  # Kafka records (partition, offset) in a sealed day more than once (must be none)
    # what the day's batches wrote (the ledger; None: a batch recorded before it was kept)
    # and the distinct records of their offsets the changelog and dead letters hold (read back)
    records_written: int | None = None
    records_held: int | None = None

    @property
    def contiguous(self) -> bool:
        return not self.holes

    @property
    def records_missing(self) -> int:
        """Records the day's batches wrote that the changelog (or its dead letters) no longer
        holds; negative: records in their offsets that no batch wrote."""
        if self.records_written is None or self.records_held is None:
            return 0
        return self.records_written - self.records_held

    @property
    def records_counted(self) -> bool:
        """Whether the day was read back and every batch of it said what it wrote."""
        return self.records_written is not None and self.records_held is not None

    @property
    def clean(self) -> bool:
        """Every offset of the day's ranges in it once: none missing, none twice, and every
        record its batches wrote still there."""
        return not self.holes and not self.records_twice and not self.records_missing

    def plus(self, batch: WindowResult) -> ChangelogDay:
        """The day with one more batch of it (``batch.window_start`` is the batch's key)."""
        ranges = dict(self.ranges)
        for r in batch.ranges:
            first, end = ranges.get(r.partition, (r.start, r.end))
            ranges[r.partition] = (min(first, r.start), max(end, r.end))
        events = dict(self.events)
        for op, n in batch.events.items():
            events[op] = events.get(op, 0) + n
        return replace(
            self,
            batches=self.batches + 1,
            ranges=ranges,
            events=events,
            dead_letters=self.dead_letters + batch.dead_letters,
        )


def seal_day(spark: SparkSession, ledger: Ledger, table: LakeTable, day: str) -> ChangelogDay:
    """Seal ``day`` of a streamed changelog, once the apply moved on to the next day: the
    whole day read back and checked (``read_day``), then compacted (never written again)."""
    sealed = read_day(spark, ledger, table, day, sealed=True)
    compact_day(spark, table, day)
    return sealed


def read_day(spark: SparkSession, ledger: Ledger, table: LakeTable, day: str, sealed: bool = False) -> ChangelogDay:
    """A streamed changelog's ``day`` read back whole: its batches' ranges from the ledger
    (holes between them that no generation restarted past), its events by op, dead letters,
    and the Kafka records it holds more than once. ``sealed``: the day is over."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    # the ledger before the tables: a batch appended meanwhile is not recorded yet, and its
    # offsets (past the recorded ones) are left out of what is counted back
    windows, written = ledger.windows_with_records(table.key)
    batches = {k: [r.offsets for r in ranges] for k, ranges in windows.items() if is_batch_key(k)}
    keys = [k for k in batches if changelog_partition(k) == day]
    ranges, in_day = partition_coverage(batches, day)
    recorded = _within(ranges)
    events, records_twice, distinct = _events_of_day(spark, table, day, recorded)
    dead = 0
    if DeltaTable.isDeltaTable(spark, table.dead_letters_path):
        letters = spark.read.format("delta").load(table.dead_letters_path).where(F.col("window_start") == day)
        dead = letters.where(recorded).select("kafka_partition", "kafka_offset").distinct().count()
    restarts = [g.watermark.kafka_end_offsets for g in ledger.generations(table.key).values()
                if g.status is GenerationStatus.COMMITTED and g.watermark is not None]  # fmt: skip
    holes = tuple(h.describe() for h in holes_not_restarted(in_day, restarts))
    counts = [written.get(k) for k in keys]
    records_written = None if None in counts else sum(c or 0 for c in counts)
    return ChangelogDay(
        table.key, day, len(keys), ranges, events, dead, sealed, holes, records_twice, records_written, distinct + dead
    )


def _within(ranges: dict[int, tuple[int, int]]) -> Column:
    """Records (``kafka_partition``, ``kafka_offset``) within ``ranges`` (partition -> first, end)."""
    from pyspark.sql import functions as F

    inside = F.lit(False)
    for partition, (first, end) in ranges.items():
        inside = inside | (
            (F.col("kafka_partition") == partition) & (F.col("kafka_offset") >= first) & (F.col("kafka_offset") < end)
        )
    return inside


def copies_of_each_record(changelog: DataFrame) -> DataFrame:
    """Each Kafka record (partition, offset) of a changelog frame with how many times the
    frame holds it (``copies``: more than one means an append that was not idempotent) and
    its op ("tombstone" for none). The one definition of "a record twice" that the keys
    check, the day check and the fault suite's accounting share."""
    from pyspark.sql import functions as F

    return changelog.groupBy("kafka_partition", "kafka_offset").agg(
        F.count(F.lit(1)).alias("copies"), F.first(F.coalesce("op", F.lit("tombstone"))).alias("op")
    )


def _events_of_day(
    spark: SparkSession, table: LakeTable, day: str, recorded: Column
) -> tuple[dict[str, int], int, int]:
    """A day's events by op (plus "tombstone"), how many of its Kafka records it holds more
    than once (an append that was not idempotent), and how many distinct records of the
    ``recorded`` offsets it holds: one aggregation, by record."""
    from pyspark.sql import functions as F

    changelog = spark.read.format("delta").load(table.changelog_path).where(F.col("window_start") == day)
    by_op = (
        copies_of_each_record(changelog)
        .withColumn("recorded", recorded)  # a record's offsets: the same for each copy
        .groupBy("op")
        .agg(
            F.sum("copies").alias("n"),
            F.sum((F.col("copies") > 1).cast("int")).alias("twice"),
            F.sum(F.col("recorded").cast("int")).alias("distinct"),
        )
        .collect()
    )
    distinct = sum(int(r["distinct"] or 0) for r in by_op)
    return {r["op"]: int(r["n"]) for r in by_op}, sum(int(r["twice"]) for r in by_op), distinct


def compact_day(spark: SparkSession, table: LakeTable, day: str) -> tuple[int, int]:
    """A sealed day's changelog partition rewritten into few files: the stream apply appends
    a file per Kafka partition and micro-batch (thousands a day), and every Delta checkpoint
    and every reader lists them all. A sealed day is never written again, so this is its
    only rewrite. Returns (files removed, files added)."""
    from delta.tables import DeltaTable

    metrics = (
        DeltaTable.forPath(spark, table.changelog_path)
        .optimize()
        .where(f"window_start = '{day}'")
        .executeCompaction()
        .select("metrics.numFilesRemoved", "metrics.numFilesAdded")
        .first()
    )
    removed, added = (int(metrics[0]), int(metrics[1])) if metrics is not None else (0, 0)
    log.info("%s: changelog day %s compacted, %d files into %d", table.key, day, removed, added)
    return removed, added
