"""Current state: the latest committed generation, then every change from its watermark offsets.

Incremental: each run applies only the changelog offsets between current's frontier and
the new one (per Kafka partition), so N new changes cost O(N) reads plus one MERGE. What
current has applied (generation, frontier, source position) is in the ledger.

* **The watermark rule (every producer).** A generation's watermark is the topic's end
  offsets, read *before* the source position and the snapshot. Current starts from the
  snapshot and applies **every** change from those offsets on, whatever its source
  position: a change the snapshot already holds is replayed in source order and the key
  converges to the same row, a change it lacks is applied. No change is compared with the
  watermark's source position, because producers do not agree on what an event's position
  means: Debezium's ``source.sequence[0]`` is the *previous* transaction's commit LSN, the
  platform's capture writes the event's own; both order the changes of one key correctly
  (conflicting writes to a row serialize), and that is all this rule needs. Snapshot rows
  are positioned ``(0, watermark LSN)``: below every streamed change.
* **Frontier.** Per Kafka partition, current has applied every offset below its frontier.
  It starts at the generation's watermark offsets and moves only across contiguous
  recorded changelog ranges (``model.coverage.walk``): windows materialized out of order
  wait until the gap before them is filled, so no change is ever skipped.
* **Order.** Within the batch, per key, events are ordered by (commit LSN, LSN, Kafka
  partition, offset); the latest decides the row. Each row keeps its position
  (``_cdc_commit_lsn``, ``_cdc_lsn``); an event at or before a row's position is ignored,
  and deleted keys remember their position (``current_deletes``, appended to: a key
  deleted twice has two rows, and any newer-or-equal one blocks an older event), so an
  at-least-once duplicate never moves a row backwards or resurrects it.
* **Cost follows the changes.** Current has deletion vectors: a MERGE marks the rows it
  replaces instead of rewriting their files. One aggregation keeps the latest event per
  key; the row count moves by the MERGE's own metrics, not by counting the table.
* **TOAST.** A column listed in ``unavailable`` keeps its value (from an earlier event of
  the batch if there is one, else the row's current value).
* **Truncate.** Streamed rows older than the truncate are removed; snapshot rows only when
  the truncate's own LSN is after the watermark LSN (an older truncate is already in the
  snapshot: the snapshot waited for its lock). Only later events apply.
* **Right after a rebuild** current may briefly show an older state of a key whose
  replayed changes span two runs; it converges when the rest is applied.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.delta_rs import table_exists
from cdc_platform.lake.driver_batch import collects_in_driver, within_driver
from cdc_platform.lake.driver_history import HISTORY_EVENT_COLUMNS, apply_history_in_driver
from cdc_platform.lake.driver_merge import (
    collected_events,
    collected_latest,
    events_collected_whole,
    latest_in_driver,
    merge_in_driver,
    merges_in_driver,
)
from cdc_platform.lake.history import HistoryResult, apply_history, ensure_history_table, events_after, snapshot_events
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import LakeTable, table_options
from cdc_platform.model.coverage import walk
from cdc_platform.model.errors import NoGenerationError
from cdc_platform.model.generations import Generation
from cdc_platform.model.state import CurrentPosition
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import WindowRange, changelog_partition

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

POSITION_COLUMNS = ("_cdc_commit_lsn", "_cdc_lsn")
# the commit position of snapshot rows (their _cdc_lsn is the watermark LSN): below every
# streamed change, whose commit position is a real LSN (or a polled source's clock)
SNAPSHOT_COMMIT = 0
# current's MERGEs mark replaced rows in deletion vectors instead of rewriting whole files
DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}
# Every micro-batch's MERGE (or append) adds a small file to current, the deletes table and
# history (its updated keys are random: their statistics prune nothing, and the next MERGE
# scans every one), and one per Kafka partition to the changelog's day (every commit's
# checkpoint lists them). Delta's auto compaction (a post-commit hook) rewrites a table's
# (or a day's) small files into one once 50 (spark.databricks.delta.autoCompact.minNumFiles)
# have piled up.
AUTO_COMPACT = {"delta.autoOptimize.autoCompact": "true"}
# A batch's keys are listed in the MERGE's condition (``_target_key_filter``) once current
# is this big: 10k random changes into 10M rows 8.1 -> 5.6 s, into 3M rows 5.0 -> 4.1 s,
# and no gain at 1M rows, where one more job costs what the filter saves
# (docs/benchmarks.md, "Current-state merge"). Up to this many keys: Spark plans a long IN
# list slowly, and Delta plans the condition many times (into 10M rows, 10k keys 7.6 -> 6.6 s,
# 20k 7.4 -> 8.0 s, 30k 7.6 -> 9.0 s, 100k 9.2 -> 15.6 s).
KEY_FILTER_MIN_ROWS = 2_000_000
KEY_FILTER_MAX_KEYS = 10_000

# The columns of each table the batches merge into (current, history), by path, in order,
# as this process last read or added them. A batch whose columns are all known skips the
# read of the table's schema (0.06-0.11 s a micro-batch on 2 cores, once more with
# history). Only the process holding the source's apply lease writes these tables; a
# rebuild (which may drop columns and creates history anew) and a failed batch forget the
# paths, and a new process starts with nothing known.
_known_columns: dict[str, tuple[str, ...]] = {}


@dataclass
class CurrentResult:
    generation: str
    rebuilt: bool
    changes_applied: int
    rows: int
    frontier: dict[int, int]
    applied_position: int
    last_source_ts: datetime | None
    duration_s: float
    waiting_for: list[str] = field(default_factory=list)  # partitions stopped at a gap
    history: HistoryResult | None = None  # when the table keeps an SCD2 history
    # a rebuild from a new generation: rows the previous current held that the source no
    # longer has (hard deletes a polled source cannot see, or deletes lost in a gap)
    dropped_by_generation: int | None = None
    dropped_sample: list[str] = field(default_factory=list)
    truncated_at: tuple[int, int] | None = None  # CurrentPosition.truncated_at


@dataclass(frozen=True)
class BatchSummary:
    """What one pass over a batch of change events tells the merge (``summarize``, or the
    changelog's statistics job for a stream batch: no second pass)."""

    changes: int  # events with an op (tombstones carry nothing the 'd' before them did not)
    max_commit: int | None = None
    min_commit: int | None = None  # the oldest event's commit position
    max_ts: datetime | None = None
    truncate: tuple[int, int] | None = None  # the newest truncate's (commit LSN, LSN)
    deletes: int = 0  # 'd' events: only then are deleted keys remembered
    min_ts: datetime | None = None  # the oldest event's commit time: its wait is the batch's longest

    def newer_than(self, applied_position: int | None) -> bool:
        """Every event committed after ``applied_position`` (the newest position current
        has applied, so after every remembered delete): none can be a stale duplicate."""
        return applied_position is not None and self.min_commit is not None and self.min_commit > applied_position


@dataclass
class _Batch:
    applied: int = 0
    max_position: int | None = None
    last_ts: datetime | None = None
    # how the MERGE moved current's row count; None after a truncate (then it is counted)
    rows_delta: int | None = 0
    truncate: tuple[int, int] | None = None  # the batch's newest truncate's (commit LSN, LSN)


def newest_truncate(*truncates: tuple[int, int] | None) -> tuple[int, int] | None:
    """The newest of the truncates given (positions order them), or None."""
    return max((t for t in truncates if t is not None), default=None)


def committed_generation(ledger: Ledger, table: LakeTable) -> Generation:
    committed = ledger.committed(table.key)
    if committed is None or committed.watermark is None:
        raise NoGenerationError(
            f"{table.key} has no committed snapshot generation yet; run: cdc-platform snapshot {table.key}"
        )
    return committed


def needs_rebuild(table: LakeTable, generation: str, position: CurrentPosition | None) -> bool:
    """Current is (re)built from the generation when it was built from another one, when
    its table is gone, or when a history table was switched on (it then starts there).
    Asked of the Delta log by delta-rs: Spark's ``isDeltaTable`` is a py4j call and a log
    replay in the JVM, 12 % of a restart of 40 tables behind (docs/benchmarks.md, "Stop 76")."""
    if position is None or position.generation != generation:
        return True
    if not table_exists(table.current_path):
        return True
    return table.config.history and not table_exists(table.history_path)


def apply_current(spark: SparkSession, ledger: Ledger, table: LakeTable) -> CurrentResult:
    started = time.monotonic()
    committed = committed_generation(ledger, table)
    schema = TableSchema.from_json(committed.schema_json)
    position = ledger.current(table.key)
    rebuilt = needs_rebuild(table, committed.generation, position)
    previous_version = _last_version(spark, table.current_path) if rebuilt and position is not None else None
    history = HistoryResult(0, 0)
    if rebuilt or position is None:
        position, history = _rebuild(spark, table, committed, schema)
    windows = ledger.windows(table.key)
    coverage = walk(position.frontier, [r.offsets for ranges in windows.values() for r in ranges])
    batch = _Batch()
    if coverage.frontier != position.frontier:
        batch, history = _apply_windows(spark, table, schema, windows, position, coverage.frontier, committed)
    if rebuilt and table.config.history:
        history = history.plus(_reconcile_history(spark, table, committed, list(schema.key)))
    rows = spark.read.format("delta").load(table.current_path).count()
    crash_point("current.merged")
    applied_position = max(position.applied_position, batch.max_position or 0)
    last_ts = batch.last_ts or position.last_source_ts
    truncated_at = newest_truncate(position.truncated_at, batch.truncate)
    ledger.record_current(
        table.key,
        CurrentPosition(
            committed.generation, coverage.frontier, applied_position, last_ts, rows, truncated_at=truncated_at
        ),
    )
    dropped: int | None = None
    sample: list[str] = []
    if previous_version is not None:
        dropped, sample = _dropped_rows(spark, table.current_path, previous_version, list(schema.key))
    return CurrentResult(
        committed.generation, rebuilt, batch.applied, rows, coverage.frontier, applied_position,
        last_ts, round(time.monotonic() - started, 3),
        [h.describe() for h in coverage.holes], history if table.config.history else None, dropped, sample,
        truncated_at,
    )  # fmt: skip


def apply_decoded(
    spark: SparkSession, ledger: Ledger, table: LakeTable, committed: Generation, position: CurrentPosition,
    changes: DataFrame, summary: BatchSummary, frontier: dict[int, int], *, arrow: pa.Table | None = None,
) -> CurrentResult:  # fmt: skip
    """The stream apply's fast path: a batch's decoded events merged straight into current,
    which stands exactly at the batch's first offsets (``position``); ``frontier`` is where
    the batch ends. Nothing is read back from the changelog and nothing is counted: the row
    count moves by the MERGE's metrics. ``arrow``: the same events, when the driver holds them."""
    started = time.monotonic()
    schema = TableSchema.from_json(committed.schema_json)
    batch, history = merge_changes(
        spark, table, schema, changes, summary, position.applied_position, position.rows, arrow=arrow,
        truncated_at=position.truncated_at,
    )  # fmt: skip
    crash_point("current.merged")
    if batch.rows_delta is None:  # a truncate deleted rows outside the MERGE's metrics
        rows = spark.read.format("delta").load(table.current_path).count()
    else:
        rows = position.rows + batch.rows_delta
    applied_position = max(position.applied_position, batch.max_position or 0)
    last_ts = batch.last_ts or position.last_source_ts
    truncated_at = newest_truncate(position.truncated_at, batch.truncate)
    position_now = CurrentPosition(
        committed.generation, dict(frontier), applied_position, last_ts, rows, truncated_at=truncated_at
    )
    ledger.record_current(table.key, position_now)
    return CurrentResult(
        committed.generation, False, batch.applied, rows, dict(frontier), applied_position, last_ts,
        round(time.monotonic() - started, 3), [], history if table.config.history else None,
        truncated_at=truncated_at,
    )  # fmt: skip


def streamed_position(ledger: Ledger, table: LakeTable) -> CurrentResult:
    """Where the stream apply left current (``lake.apply``), without writing: what a Dagster
    run of a streamed table reports and checks."""
    position = ledger.current(table.key)
    if position is None:
        raise NoGenerationError(
            f"{table.key}: the stream apply has not built current yet; is it running? "
            f"cdc-platform apply --source {table.source}"
        )
    return CurrentResult(
        position.generation, False, 0, position.rows, dict(position.frontier), position.applied_position,
        position.last_source_ts, 0.0, truncated_at=position.truncated_at,
    )  # fmt: skip


def ensure_table_properties(spark: SparkSession, table: LakeTable) -> None:
    """Tables of older lakes (or overwritten in place) get today's properties: current and
    history deletion vectors (unless ``lake.deletion_vectors: false``), and current, the
    deletes table, history and the changelog auto compaction and the configured retention of
    replaced files (``lake.retain_old_files_hours``). Set once each; the next commit uses them."""
    wanted = {table.current_path: _merged_into(table)}
    wanted[table.deletes_path] = wanted[table.changelog_path] = appended_to(table)
    if table.config.history:
        wanted[table.history_path] = _merged_into(table)
    for path, properties in wanted.items():
        _ensure_properties(spark, path, properties)


def _merged_into(table: LakeTable) -> dict[str, str]:
    """The properties of a table every batch MERGEs into (current, history): a MERGE marks
    the rows it replaces instead of copying the rest of their files (without, history's
    MERGE rewrote every file a batch's keys touched: its cost grew with the history)."""
    return {**(DELETION_VECTORS if table.deletion_vectors else {}), **AUTO_COMPACT, **table.retention}


def appended_to(table: LakeTable) -> dict[str, str]:
    """The properties of a table batches append to (the changelog, the deletes table): auto
    compaction and the retention of replaced files."""
    return {**AUTO_COMPACT, **table.retention}


def _ensure_properties(spark: SparkSession, path: str, properties: dict[str, str]) -> None:
    have = _properties(spark, path)
    if have is None:
        return  # not written yet
    missing = {k: v for k, v in properties.items() if have.get(k) != v}
    if missing:
        settings = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(missing.items()))
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})")


def _properties(spark: SparkSession, path: str) -> dict[str, str] | None:
    """The table's properties, None when it was never written. delta-rs reads them from the
    log in the driver; a process's first look at each of its tables (a restart) then costs
    no Spark snapshot of each. Spark answers when delta-rs cannot read the table."""
    from deltalake import DeltaTable as RustTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return dict(RustTable(path).metadata().configuration)
    except TableNotFoundError:
        return None
    except Exception:  # a feature delta-rs does not read
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, path):
            return None
        # SHOW TBLPROPERTIES reads the table's metadata alone; DESCRIBE DETAIL also sums its
        # files, a Spark job over the whole state of a table the rebuild has just rewritten
        shown = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
        return {str(r["key"]): str(r["value"]) for r in shown}


def _last_version(spark: SparkSession, path: str) -> int | None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    last = DeltaTable.forPath(spark, path).history(1).select("version").first()
    return int(last["version"]) if last else None


def _rebuild(
    spark: SparkSession, table: LakeTable, committed: Generation, schema: TableSchema
) -> tuple[CurrentPosition, HistoryResult]:
    """Current from the generation's snapshot, its rows positioned below every streamed change."""
    from pyspark.sql import functions as F

    assert committed.watermark is not None
    watermark = committed.watermark
    forget_columns(table.current_path, table.history_path)
    frame = spark.read.format("delta").load(table.snapshot_path(committed.generation))
    frame.select(
        "*",
        F.lit(SNAPSHOT_COMMIT).cast("long").alias("_cdc_commit_lsn"),
        F.lit(watermark.position).cast("long").alias("_cdc_lsn"),
    ).write.format("delta").mode("overwrite").option("overwriteSchema", "true").options(
        **table_options(frame.schema), **_merged_into(table)
    ).save(table.current_path)
    keys = list(schema.key)
    key_schema = ", ".join(f"`{k}` {frame.schema[k].dataType.simpleString()}" for k in keys)
    deletes = spark.createDataFrame([], f"{key_schema}, _cdc_commit_lsn long, _cdc_lsn long")
    deletes.write.format("delta").mode("overwrite").option("overwriteSchema", "true").options(
        **table_options(deletes.schema), **appended_to(table)
    ).save(table.deletes_path)
    if table.config.history:
        ensure_history_table(spark, table.history_path, frame.schema, _merged_into(table))
    ensure_table_properties(spark, table)
    # the source as of the watermark: until a change is applied, freshness runs from its time
    # (with no time the fresh check found the lag unknown and passed however long changes waited)
    position = CurrentPosition(
        committed.generation, dict(watermark.kafka_end_offsets), watermark.position, watermark.taken_at
    )
    return position, HistoryResult(0, 0)


def _apply_windows(
    spark: SparkSession, table: LakeTable, schema: TableSchema, windows: dict[str, tuple[WindowRange, ...]],
    position: CurrentPosition, frontier: dict[int, int], committed: Generation,
) -> tuple[_Batch, HistoryResult]:  # fmt: skip
    """Merge the offsets between the old and the new frontier, read back from the changelog,
    into current (and history)."""
    assert committed.watermark is not None
    touched = sorted(
        w for w, rs in windows.items()
        if any(position.frontier.get(r.partition, 0) < r.end and r.start < frontier.get(r.partition, 0) for r in rs)
    )  # fmt: skip
    if not touched:
        return _Batch(), HistoryResult(0, 0)
    batch = _changes(spark, table, touched, position.frontier, frontier).cache()
    try:
        return merge_changes(
            spark, table, schema, batch, None, position.applied_position, position.rows,
            truncated_at=position.truncated_at,
        )  # fmt: skip
    finally:
        batch.unpersist()


def merge_changes(
    spark: SparkSession, table: LakeTable, schema: TableSchema, changes: DataFrame, summary: BatchSummary | None = None,
    applied_position: int | None = None, current_rows: int | None = None, *, arrow: pa.Table | None = None,
    truncated_at: tuple[int, int] | None = None,
) -> tuple[_Batch, HistoryResult]:  # fmt: skip
    """Merge change events (changelog columns, ``op`` set) into current and history.
    ``summary``: the batch's statistics when the caller already has them (one pass fewer);
    ``applied_position``, ``current_rows``: the newest position current has applied and
    the rows it holds, when known; ``arrow``: the events in the driver, when it holds them;
    ``truncated_at``: the newest truncate current has applied (``CurrentPosition``). The
    result's ``truncate`` is the batch's own newest."""
    keys = list(schema.key)
    summary = summary or summarize(changes)
    if summary.changes == 0:
        return _Batch(), HistoryResult(0, 0)
    current_columns = _evolve(spark, table.current_path, changes)
    if table.config.history:
        _evolve(spark, table.history_path, changes)
    guard = not summary.newer_than(applied_position)
    columns = [c for c in current_columns if c not in POSITION_COLUMNS]
    into_current = changes
    if guard and truncated_at is not None:
        # a re-sent event older than a truncate current applied: the truncate removed its row
        # (history's own positions already drop it)
        into_current = changes.where(events_after(truncated_at))
    if not table.config.history:
        merged = _merge(spark, table, into_current, keys, columns, summary, guard, current_rows, arrow=arrow)
        merged.truncate = summary.truncate
        return merged, HistoryResult(0, 0)
    # History and current are independent tables: their MERGEs run at once, so a batch of a
    # table with history costs less than the two one after the other (8.9 -> 7.8 s for 20
    # changes on 2 cores, docs/benchmarks.md). Leaving the pool waits for both: a failed
    # batch never leaves one of them running while the batch is applied again.
    with ThreadPoolExecutor(1, "history") as pool:
        history = pool.submit(_apply_history, spark, table, changes, keys, columns, summary, arrow)
        result = _merge(spark, table, into_current, keys, columns, summary, guard, current_rows, arrow=arrow)
    result.truncate = summary.truncate
    return result, history.result()


def _apply_history(
    spark: SparkSession, table: LakeTable, changes: DataFrame, keys: list[str], columns: list[str],
    summary: BatchSummary, arrow: pa.Table | None,
) -> HistoryResult:  # fmt: skip
    """The batch into history: sequenced in the driver and merged by delta-rs when history
    is small and the driver holds the batch's events or may collect them
    (``driver_history``), else by Spark. ``arrow``: the events, when the driver holds them."""
    if summary.truncate is None and (arrow is not None or events_collected_whole(summary.changes)):
        events = arrow
        if events is None and collects_in_driver(table, summary.changes):
            events = within_driver(
                table, f"a batch of {summary.changes} changes for history",
                lambda: collected_events(changes, HISTORY_EVENT_COLUMNS),
            )  # fmt: skip
        applied = None if events is None else apply_history_in_driver(table, events, keys, columns)
        if applied is not None:
            return applied
    return apply_history(spark, table.history_path, changes, keys, columns, summary.truncate is not None)


def summarize(changes: DataFrame) -> BatchSummary:
    """One pass over the batch: its size, its newest position and time, its newest truncate."""
    from pyspark.sql import functions as F

    row = changes.agg(
        F.count(F.lit(1)).alias("n"),
        F.max("commit_lsn").alias("max_commit"),
        F.min("commit_lsn").alias("min_commit"),
        F.max("source_ts").alias("max_ts"),
        F.max(F.when(F.col("op") == "t", F.struct("commit_lsn", "lsn"))).alias("t"),
        F.count(F.when(F.col("op") == "d", F.lit(1))).alias("deletes"),
    ).first()
    assert row is not None
    truncate = (int(row["t"]["commit_lsn"]), int(row["t"]["lsn"])) if row["t"] is not None else None
    max_commit = int(row["max_commit"]) if row["max_commit"] is not None else None
    min_commit = int(row["min_commit"]) if row["min_commit"] is not None else None
    return BatchSummary(int(row["n"]), max_commit, min_commit, _utc(row["max_ts"]), truncate, int(row["deletes"]))


def _utc(ts: datetime | None) -> datetime | None:
    return ts.astimezone(UTC) if ts is not None else None  # Spark hands back naive local time


def _evolve(spark: SparkSession, path: str, batch: DataFrame) -> tuple[str, ...]:
    """Columns the source added (compatible change, already in the changelog's images) are
    added to the target table; rows from before the change keep NULL in them. Returns the
    table's columns after that."""
    fields = batch.schema["after"].dataType.fields  # type: ignore[attr-defined]
    known = _known_columns.get(path)
    if known is not None and {f.name for f in fields} <= set(known):
        return known
    have = _columns(spark, path)
    added = [f for f in fields if f.name not in have]
    if added:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
    _known_columns[path] = (*have, *[f.name for f in added])
    return _known_columns[path]


def _columns(spark: SparkSession, path: str) -> tuple[str, ...]:
    """The table's columns, from its log by delta-rs: Spark's snapshot of each table was 15 %
    of a restart of 40 tables behind (docs/benchmarks.md, "Stop 76"). Spark answers when
    delta-rs cannot read the table."""
    from deltalake import DeltaTable as RustTable

    try:
        return tuple(f.name for f in RustTable(path).schema().fields)
    except Exception:  # a feature delta-rs does not read
        return tuple(spark.read.format("delta").load(path).columns)


def forget_columns(*paths: str) -> None:
    """The next batch into these tables reads their columns again (they were rewritten)."""
    for path in paths:
        _known_columns.pop(path, None)


def _dropped_rows(spark: SparkSession, path: str, previous_version: int, keys: list[str]) -> tuple[int, list[str]]:
    """Keys the previous current (Delta version ``previous_version``) held that the rebuilt one has not."""
    from cdc_platform.lake.compare import keys_only_in

    before = spark.read.format("delta").option("versionAsOf", previous_version).load(path)
    now = spark.read.format("delta").load(path).select(*[f"`{k}`" for k in keys])
    return keys_only_in(before, now, keys, "dropped")


def _reconcile_history(spark: SparkSession, table: LakeTable, committed: Generation, keys: list[str]) -> HistoryResult:
    """After a rebuild and the replay from the watermark offsets, history's open versions
    are made to agree with current (the generation repairs what a gap lost): keys whose
    open version differs open a version, open keys current lacks are closed."""
    assert committed.watermark is not None
    rows = spark.read.format("delta").load(table.current_path).drop(*POSITION_COLUMNS)
    events = snapshot_events(
        spark, table.history_path, rows, keys, committed.watermark.position, committed.watermark.taken_at.isoformat()
    )
    return apply_history(spark, table.history_path, events, keys, rows.columns, truncates=False)


def _changes(
    spark: SparkSession, table: LakeTable, windows: list[str], frontier: dict[int, int], new_frontier: dict[int, int]
) -> DataFrame:
    from pyspark.sql import functions as F

    in_range = None
    for partition, end in new_frontier.items():
        start = frontier.get(partition, 0)
        if end <= start:
            continue
        clause = (
            (F.col("kafka_partition") == partition) & (F.col("kafka_offset") >= start) & (F.col("kafka_offset") < end)
        )
        in_range = clause if in_range is None else in_range | clause
    assert in_range is not None
    return (
        spark.read.format("delta")
        .load(table.changelog_path)
        # partition pruning: read only these windows' (or stream batches' days') partitions
        .where(F.col("window_start").isin(sorted({changelog_partition(w) for w in windows})))
        .where(in_range)
        .where(F.col("op").isNotNull())  # tombstones carry nothing the 'd' before them did not
    )


def _merge(
    spark: SparkSession, table: LakeTable, batch: DataFrame, keys: list[str], columns: list[str],
    summary: BatchSummary, guard: bool, current_rows: int | None, *, arrow: pa.Table | None = None,
) -> _Batch:  # fmt: skip
    """``columns``: current's, but the positions. ``guard``: whether an event may be older
    than a remembered delete (then it is checked against them; a join with the deletes
    table, a third of a small batch's MERGE time). ``arrow``: the batch's rows, when the
    driver holds them."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if summary.truncate is not None:
        batch = _truncate(DeltaTable.forPath(spark, table.current_path), batch, *summary.truncate)
    if merges_in_driver(table, current_rows, summary.changes, summary.truncate is not None, [*keys, *columns]) and (
        arrow is not None or collects_in_driver(table, summary.changes)
    ):
        collected = within_driver(
            table, f"the latest rows of a batch of {summary.changes} changes",
            lambda: _latest_for_driver(spark, table, batch, arrow, keys, columns, guard, summary.changes),
        )  # fmt: skip
        driver = None if collected is None else merge_in_driver(table, collected, keys, columns, summary.deletes > 0)
        if driver is not None:
            return _Batch(summary.changes, summary.max_commit, summary.max_ts, driver.inserted - driver.deleted)
    latest = _latest_per_key(batch.where(F.col("op") != "t"), keys, columns)
    # the keys before the guard's join with the deletes table: a superset is as exact
    key_filter = _target_key_filter(latest, keys) if (current_rows or 0) >= KEY_FILTER_MIN_ROWS else ""
    if guard:
        latest = _not_deleted_later(spark, table, latest, keys)
    # The deleted keys are appended while the MERGE runs: another table, and nothing the
    # guard above reads can change by it (a key is remembered only where its latest event
    # is the delete, and a delete is never dropped). Leaving the pool waits for both.
    target = DeltaTable.forPath(spark, table.current_path)  # after the truncate's commit
    with ThreadPoolExecutor(1, "deletes") as pool:
        remembered = pool.submit(_remember_deletes, table, latest, keys) if summary.deletes else None
        metrics = _merge_latest(target, latest, keys, columns, key_filter)
    if remembered is not None:
        remembered.result()
    if summary.truncate is None:
        rows_delta: int | None = int(metrics["num_inserted_rows"]) - int(metrics["num_deleted_rows"])
    else:
        rows_delta = None
    return _Batch(summary.changes, summary.max_commit, summary.max_ts, rows_delta)


def _latest_for_driver(
    spark: SparkSession, table: LakeTable, batch: DataFrame, arrow: pa.Table | None, keys: list[str],
    columns: list[str], guard: bool, changes: int,
) -> pa.Table:  # fmt: skip
    """The batch's latest event per key for delta-rs' merge: computed in Arrow from the
    batch's events (``arrow``, or collected when ``events_collected_whole``: one plain
    Spark job, no shuffle), or by Spark and then collected, one row per key: for a bigger
    batch (its whole events would be a backlog in the driver's memory), when the
    resurrection guard must join the remembered deletes (a replayed batch), or when Arrow's
    grouping cannot take the key (``driver_merge.latest_in_driver``)."""
    from pyspark.sql import functions as F

    if not guard and (arrow is not None or events_collected_whole(changes)):
        latest = latest_in_driver(arrow if arrow is not None else collected_events(batch), keys, columns)
        if latest is not None:
            return latest
    by_spark = _latest_per_key(batch.where(F.col("op") != "t"), keys, columns)
    if guard:
        by_spark = _not_deleted_later(spark, table, by_spark, keys)
    return collected_latest(by_spark, keys, columns)


def _truncate(target: Any, batch: DataFrame, t_commit: int, t_lsn: int) -> DataFrame:
    """Rows older than the truncate go (snapshot rows: when the truncate's LSN is after the
    watermark LSN they carry); only the batch's later events still apply."""
    from pyspark.sql import functions as F

    commit, lsn = F.col("_cdc_commit_lsn"), F.col("_cdc_lsn")
    snapshot_row = commit == SNAPSHOT_COMMIT
    streamed_older = (commit < t_commit) | ((commit == t_commit) & (lsn < t_lsn))
    target.delete((snapshot_row & (lsn < t_lsn)) | (~snapshot_row & streamed_older))
    return batch.where(events_after((t_commit, t_lsn)))


def _latest_per_key(batch: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
    """Per key: the latest op and position, and per column the latest value among events
    that carried it (a struct: a real NULL is still a value; TOASTed columns are not)."""
    from pyspark.sql import functions as F

    order = F.struct("commit_lsn", "lsn", "kafka_partition", "kafka_offset")
    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    keyed = batch.select("*", *[image[k].alias(f"__key_{k}") for k in keys], order.alias("__order"))
    aggregates = [
        F.max_by("op", "__order").alias("op"),
        F.max("__order").alias("__order"),
        F.max("source_ts").alias("source_ts"),
    ]
    for c in columns:
        available = ~F.coalesce(F.array_contains("unavailable", c), F.lit(False)) & (F.col("op") != "d")
        aggregates.append(
            F.max_by(F.struct(F.col("after")[c].alias("v")), F.when(available, F.col("__order"))).alias(f"__v_{c}")
        )
    return keyed.groupBy(*[f"__key_{k}" for k in keys]).agg(*aggregates)


def _not_deleted_later(spark: SparkSession, table: LakeTable, latest: DataFrame, keys: list[str]) -> DataFrame:
    """A duplicate older than a remembered delete must not resurrect the row: any remembered
    delete of the key at or after the event's position drops an insert or update. A delete
    is never dropped (applying one again is harmless: newer rows keep their position)."""
    from pyspark.sql import functions as F

    deletes = spark.read.format("delta").load(table.deletes_path)
    cond = [F.col(f"l.__key_{k}").eqNullSafe(F.col(f"d.{k}")) for k in keys]
    stale = (F.col("d._cdc_commit_lsn") > F.col("l.__order.commit_lsn")) | (
        (F.col("d._cdc_commit_lsn") == F.col("l.__order.commit_lsn")) & (F.col("d._cdc_lsn") >= F.col("l.__order.lsn"))
    )
    joined = cond[0]
    for c in cond[1:]:
        joined = joined & c
    resurrects = F.col("l.op") != "d"
    return latest.alias("l").join(deletes.alias("d"), on=joined & stale & resurrects, how="left_anti")


def _target_key_filter(latest: DataFrame, keys: list[str]) -> str:
    """``t.k IN (the batch's values)`` for each integral key column, or "" (other key types,
    or more than ``KEY_FILTER_MAX_KEYS`` keys). Implied by the MERGE's key match, so it
    changes nothing it matches; it lets Spark drop current's other rows before the MERGE's
    outer join (which otherwise shuffles every row of every touched file: all of them for
    random keys) and Delta skip files whose key range misses the batch. Only integral keys:
    their literals print exactly, where a string's would pass through the SQL parser's
    variable substitution."""
    from pyspark.sql import types as T

    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    fields = {f.name: f.dataType for f in latest.schema.fields}
    if not all(isinstance(fields[f"__key_{k}"], integral) for k in keys):
        return ""
    rows = latest.select(*[f"__key_{k}" for k in keys]).limit(KEY_FILTER_MAX_KEYS + 1).collect()
    if not rows or len(rows) > KEY_FILTER_MAX_KEYS:
        return ""
    parts = []
    for i, k in enumerate(keys):
        values = sorted({int(r[i]) for r in rows if r[i] is not None})
        listed = f"t.`{k}` IN ({','.join(map(str, values))})" if values else "false"
        parts.append(f"({listed} OR t.`{k}` IS NULL)" if any(r[i] is None for r in rows) else listed)
    return " AND ".join(parts)


def _merge_latest(
    target: Any, latest: DataFrame, keys: list[str], columns: list[str], key_filter: str = ""
) -> dict[str, Any]:
    """The MERGE; returns Delta's metrics (rows inserted, updated, deleted). ``key_filter``:
    a predicate on current's keys the match implies (``_target_key_filter``)."""
    # (commit LSN, LSN) compared as a pair: an event at or before the row's position is a duplicate
    newer = (
        "(s.__order.commit_lsn > t._cdc_commit_lsn"
        " OR (s.__order.commit_lsn = t._cdc_commit_lsn AND s.__order.lsn > t._cdc_lsn))"
    )
    match = " AND ".join([f"t.`{k}` <=> s.`__key_{k}`" for k in keys] + ([key_filter] if key_filter else []))
    values = {f"`{c}`": f"CASE WHEN s.`__v_{c}` IS NOT NULL THEN s.`__v_{c}`.v ELSE t.`{c}` END" for c in columns}
    inserts = {f"`{c}`": f"s.`__v_{c}`.v" for c in columns}
    position = {"_cdc_commit_lsn": "s.__order.commit_lsn", "_cdc_lsn": "s.__order.lsn"}
    metrics = (
        target.alias("t")
        .merge(latest.alias("s"), match)
        .whenMatchedDelete(condition=f"s.op = 'd' AND {newer}")
        .whenMatchedUpdate(condition=f"s.op <> 'd' AND {newer}", set={**values, **position})
        .whenNotMatchedInsert(condition="s.op <> 'd'", values={**inserts, **position})
        .execute()
        .first()
    )
    return metrics.asDict() if metrics is not None else {"num_inserted_rows": 0, "num_deleted_rows": 0}


def _remember_deletes(table: LakeTable, latest: DataFrame, keys: list[str]) -> None:
    """Appended, not merged (a MERGE costs several Spark jobs per batch): the guard above
    takes any remembered delete of the key, so older rows of a key do no harm."""
    from pyspark.sql import functions as F

    removed = latest.where(F.col("op") == "d").select(
        *[F.col(f"__key_{k}").alias(k) for k in keys],
        F.col("__order.commit_lsn").alias("_cdc_commit_lsn"),
        F.col("__order.lsn").alias("_cdc_lsn"),
    )
    removed.write.format("delta").mode("append").save(table.deletes_path)
