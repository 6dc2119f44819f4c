"""Current state: the latest snapshot generation, then every change after its watermark.

Incremental: each run applies only the changelog offsets between the previous frontier
and the new one (per Kafka partition), so N new changes cost O(N) reads plus one MERGE.

* **Frontier.** Per Kafka partition, current has applied every offset below its frontier.
  The frontier starts at the generation's watermark offsets and moves only across
  contiguous recorded changelog ranges: windows materialized out of order wait until the
  gap before them is filled, so no change is ever skipped.
* **Order.** Within the batch, per key, events are ordered by (commit LSN, LSN, Kafka
  partition, offset); the latest decides the row. Each row keeps its position
  (``_cdc_commit_lsn``, ``_cdc_lsn``); an event at or before a row's position is ignored,
  and deleted keys remember their position (``current_deletes``), so an at-least-once
  duplicate never moves a row backwards or resurrects it.
* **TOAST.** A column listed in ``unavailable`` keeps its value (from an earlier event of
  the batch if there is one, else the row's current value).
* **Truncate.** Rows older than the truncate are removed; only later events apply.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.spark.changelog import OffsetRange, changelog_path, recorded_ranges
from cdc_platform.spark.history import HistoryResult, apply_history, ensure_history_table, snapshot_events
from cdc_platform.spark.snapshot import generation_info, list_generations, table_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

POSITION_COLUMNS = ("_cdc_commit_lsn", "_cdc_lsn")


class CurrentStateError(RuntimeError):
    pass


@dataclass
class CurrentResult:
    generation: str
    rebuilt: bool
    changes_applied: int
    rows: int
    frontier: dict[int, int]
    applied_commit_lsn: int | None
    last_source_ts: str | None
    duration_s: float
    waiting_for: list[str] = field(default_factory=list)  # partitions stopped at a gap
    history: HistoryResult | None = None  # when the table keeps an SCD2 history
    # a rebuild from a new generation: rows the previous current held that the source no
    # longer has (hard deletes a polled source cannot see, or deletes lost in a gap)
    dropped_by_generation: int | None = None
    dropped_sample: list[str] = field(default_factory=list)


def current_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/current"


def _state_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/current_state"


def history_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/history"


def _deletes_path(config: PlatformConfig, table: TableConfig) -> str:
    return f"{table_root(config, table)}/current_deletes"


def _read_state(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> dict[str, Any] | None:
    from delta.tables import DeltaTable

    path = _state_path(config, table)
    if not DeltaTable.isDeltaTable(spark, path) or not DeltaTable.isDeltaTable(spark, current_path(config, table)):
        return None
    row = spark.read.format("delta").load(path).first()
    return json.loads(row["state"]) if row else None


def pending_generation(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> tuple[str | None, bool]:
    """(latest generation, whether the next apply rebuilds current from it)."""
    generations = list_generations(spark, config, table)
    if not generations:
        return None, False
    state = _read_state(spark, config, table)
    return generations[-1], state is None or state.get("generation") != generations[-1]


def _evolve(spark: SparkSession, path: str, batch: DataFrame) -> list[str]:
    """Columns the source added (compatible change, already in the changelog's images) are
    added to the target table; rows from before the change keep NULL in them."""
    target = spark.read.format("delta").load(path)
    have = set(target.columns)
    after_type = batch.schema["after"].dataType
    added = [f for f in after_type.fields if f.name not in have]  # type: ignore[attr-defined]
    if added:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
    return [f.name for f in added]


def current_state(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> dict[str, Any] | None:
    """What current has applied (generation, frontier per Kafka partition, last LSN), or None."""
    return _read_state(spark, config, table)


def _write_state(spark: SparkSession, config: PlatformConfig, table: TableConfig, state: dict[str, Any]) -> None:
    spark.createDataFrame([(json.dumps(state),)], "state string").write.format("delta").mode("overwrite").save(
        _state_path(config, table)
    )


def advance_frontier(frontier: dict[int, int], ranges: dict[str, list[OffsetRange]]) -> dict[int, int]:
    """Move each partition's frontier across contiguous recorded ranges."""
    by_partition: dict[int, list[OffsetRange]] = {}
    for window_ranges in ranges.values():
        for r in window_ranges:
            by_partition.setdefault(r.partition, []).append(r)
    out = dict(frontier)
    for partition, partition_ranges in by_partition.items():
        position = out.get(partition, 0)
        moved = True
        while moved:
            moved = False
            for r in partition_ranges:
                if r.start <= position < r.end:
                    position, moved = r.end, True
        out[partition] = position
    return out


def apply_changes(spark: SparkSession, config: PlatformConfig, table: TableConfig) -> CurrentResult:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    started = time.monotonic()
    generations = list_generations(spark, config, table)
    if not generations:
        raise CurrentStateError(f"{table.key} has no snapshot generation yet; run: cdc-platform snapshot {table.key}")
    generation = generations[-1]
    snapshot = f"{table_root(config, table)}/snapshot/{generation}"
    info = generation_info(spark, snapshot)
    watermark_lsn = int(info["watermark_lsn"])
    state = _read_state(spark, config, table)
    path = current_path(config, table)
    history = history_path(config, table) if table.history else None
    # a history table switched on later starts from the generation, so it misses nothing
    rebuilt = (
        state is None
        or state.get("generation") != generation
        or (history is not None and not DeltaTable.isDeltaTable(spark, history))
    )
    history_result = HistoryResult(0, 0)
    previous_version: int | None = None
    if rebuilt and state is not None and DeltaTable.isDeltaTable(spark, path):
        last = DeltaTable.forPath(spark, path).history(1).select("version").first()
        previous_version = int(last["version"]) if last else None
    if rebuilt:
        frame = spark.read.format("delta").load(snapshot)
        frame.select(
            "*", F.lit(watermark_lsn).cast("long").alias("_cdc_commit_lsn"), F.lit(0).cast("long").alias("_cdc_lsn")
        ).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
        key_schema = ", ".join(f"`{k}` {frame.schema[k].dataType.simpleString()}" for k in _key_columns(table, info))
        spark.createDataFrame([], f"{key_schema}, _cdc_commit_lsn long, _cdc_lsn long").write.format("delta").mode(
            "overwrite"
        ).option("overwriteSchema", "true").save(_deletes_path(config, table))
        if history is not None:
            ensure_history_table(spark, history, frame.schema)
            events = snapshot_events(spark, history, frame, _key_columns(table, info), watermark_lsn, info["taken_at"])
            history_result = apply_history(spark, history, events, _key_columns(table, info), frame.columns)
        state = {
            "generation": generation,
            "watermark_lsn": watermark_lsn,
            "frontier": {str(p): o for p, o in info.get("kafka_end_offsets", {}).items()},
            "applied_commit_lsn": watermark_lsn,
            "last_source_ts": None,
        }
    assert state is not None
    frontier = {int(p): int(o) for p, o in state["frontier"].items()}
    ranges = recorded_ranges(spark, config, table)
    new_frontier = advance_frontier(frontier, ranges)
    windows = sorted(
        w
        for w, rs in ranges.items()
        if any(frontier.get(r.partition, 0) < r.end and r.start < new_frontier[r.partition] for r in rs)
    )
    applied = 0
    if windows and new_frontier != frontier:
        batch = _batch(spark, config, table, windows, frontier, new_frontier, watermark_lsn).cache()
        try:
            _evolve(spark, path, batch)
            if history is not None:
                _evolve(spark, history, batch)
            applied, max_commit, last_ts = _merge(spark, config, table, batch, _key_columns(table, info))
            if history is not None and applied:
                columns = [c for c in spark.read.format("delta").load(path).columns if c not in POSITION_COLUMNS]
                more = apply_history(spark, history, batch, _key_columns(table, info), columns)
                history_result = HistoryResult(
                    history_result.versions_opened + more.versions_opened,
                    history_result.versions_closed + more.versions_closed,
                )
        finally:
            batch.unpersist()
        if max_commit is not None:
            state["applied_commit_lsn"] = max(int(state["applied_commit_lsn"]), max_commit)
        if last_ts is not None:
            state["last_source_ts"] = last_ts
    state["frontier"] = {str(p): o for p, o in new_frontier.items()}
    _write_state(spark, config, table, state)
    rows = spark.read.format("delta").load(path).count()
    dropped: int | None = None
    dropped_sample: list[str] = []
    if previous_version is not None:
        dropped, dropped_sample = _dropped_rows(spark, path, previous_version, _key_columns(table, info))
    waiting = [
        f"partition {p} at offset {o}"
        for p, o in new_frontier.items()
        if any(r.partition == p and r.start > o for rs in ranges.values() for r in rs)
    ]
    return CurrentResult(
        generation=generation,
        rebuilt=rebuilt,
        changes_applied=applied,
        rows=rows,
        frontier=new_frontier,
        applied_commit_lsn=int(state["applied_commit_lsn"]),
        last_source_ts=state.get("last_source_ts"),
        duration_s=round(time.monotonic() - started, 3),
        waiting_for=waiting,
        history=history_result if history is not None else None,
        dropped_by_generation=dropped,
        dropped_sample=dropped_sample,
    )


def _dropped_rows(spark: SparkSession, path: str, previous_version: int, keys: list[str]) -> tuple[int, list[str]]:
    """Keys the previous current (Delta version ``previous_version``) held that the rebuilt one has not."""
    from cdc_platform.spark.checks import keys_only_in

    before = spark.read.format("delta").option("versionAsOf", previous_version).load(path)
    now = spark.read.format("delta").load(path).select(*[f"`{k}`" for k in keys])
    return keys_only_in(before, now, keys, "dropped")


def _key_columns(table: TableConfig, info: dict[str, Any]) -> list[str]:
    keys = info.get("key_columns") or table.primary_key
    if not keys:
        raise CurrentStateError(f"{table.key}: the snapshot does not name its key columns; take a new generation")
    return list(keys)


def _batch(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    windows: list[str],
    frontier: dict[int, int],
    new_frontier: dict[int, int],
    watermark_lsn: int,
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
        .load(changelog_path(config, table))
        .where(F.col("window_start").isin(windows))  # partition pruning: read only these windows
        .where(in_range)
        .where(F.col("op").isNotNull())  # tombstones carry nothing the 'd' before them did not
        .where(F.col("commit_lsn") > watermark_lsn)  # older changes are in the snapshot
    )


def _merge(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, batch: DataFrame, keys: list[str]
) -> tuple[int, int | None, str | None]:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    # one pass over the batch: its size, its newest position, and the newest truncate
    summary = batch.agg(
        F.count(F.lit(1)).alias("n"),
        F.max("commit_lsn").alias("max_commit"),
        F.max("source_ts").alias("max_ts"),
        F.max(F.when(F.col("op") == "t", F.struct("commit_lsn", "lsn"))).alias("t"),
    ).first()
    assert summary is not None
    count = int(summary["n"])
    if count == 0:
        return 0, None, None
    target = DeltaTable.forPath(spark, current_path(config, table))
    columns = [f.name for f in target.toDF().schema.fields if f.name not in POSITION_COLUMNS]
    order = F.struct("commit_lsn", "lsn", "kafka_partition", "kafka_offset")

    if summary["t"] is not None:
        t_commit, t_lsn = summary["t"]["commit_lsn"], summary["t"]["lsn"]
        target.delete(
            (F.col("_cdc_commit_lsn") < t_commit)
            | ((F.col("_cdc_commit_lsn") == t_commit) & (F.col("_cdc_lsn") < t_lsn))
        )
        batch = batch.where(
            (F.col("commit_lsn") > t_commit) | ((F.col("commit_lsn") == t_commit) & (F.col("lsn") > t_lsn))
        )
    batch = batch.where(F.col("op") != "t")

    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    keyed = batch.select("*", *[image[k].alias(f"__key_{k}") for k in keys], order.alias("__order"))
    aggregates = [
        F.max_by("op", "__order").alias("op"),
        F.max("__order").alias("__order"),
        F.max("source_ts").alias("source_ts"),
    ]
    for c in columns:
        available = ~F.coalesce(F.array_contains("unavailable", c), F.lit(False)) & (F.col("op") != "d")
        # latest value among events that carried it (struct: a real NULL is still a value)
        aggregates.append(
            F.max_by(F.struct(F.col("after")[c].alias("v")), F.when(available, F.col("__order"))).alias(f"__v_{c}")
        )
    latest = keyed.groupBy(*[f"__key_{k}" for k in keys]).agg(*aggregates)

    # a duplicate older than a remembered delete must not resurrect the row
    deletes = spark.read.format("delta").load(_deletes_path(config, table))
    cond = [F.col(f"l.__key_{k}") == F.col(f"d.{k}") for k in keys]
    stale = (F.col("d._cdc_commit_lsn") > F.col("l.__order.commit_lsn")) | (
        (F.col("d._cdc_commit_lsn") == F.col("l.__order.commit_lsn")) & (F.col("d._cdc_lsn") >= F.col("l.__order.lsn"))
    )
    latest = (
        latest.alias("l")
        .join(deletes.alias("d"), on=cond, how="left")
        .where(~F.coalesce(stale, F.lit(False)))
        .select("l.*")
    )

    # (commit LSN, LSN) compared as a pair: an event at or before the row's position is a duplicate
    newer = (
        "(s.__order.commit_lsn > t._cdc_commit_lsn"
        " OR (s.__order.commit_lsn = t._cdc_commit_lsn AND s.__order.lsn > t._cdc_lsn))"
    )
    match = " AND ".join(f"t.`{k}` <=> s.`__key_{k}`" for k in keys)
    values = {f"`{c}`": f"CASE WHEN s.`__v_{c}` IS NOT NULL THEN s.`__v_{c}`.v ELSE t.`{c}` END" for c in columns}
    inserts = {f"`{c}`": f"s.`__v_{c}`.v" for c in columns}
    position = {"_cdc_commit_lsn": "s.__order.commit_lsn", "_cdc_lsn": "s.__order.lsn"}
    (
        target.alias("t")
        .merge(latest.alias("s"), match)
        .whenMatchedDelete(condition=f"s.op = 'd' AND {newer}")
        .whenMatchedUpdate(condition=f"s.op <> 'd' AND {newer}", set={**values, **position})
        .whenNotMatchedInsert(condition="s.op <> 'd'", values={**inserts, **position})
        .execute()
    )
    removed = latest.where(F.col("op") == "d").select(
        *[F.col(f"__key_{k}").alias(k) for k in keys],
        F.col("__order.commit_lsn").alias("_cdc_commit_lsn"),
        F.col("__order.lsn").alias("_cdc_lsn"),
    )
    dmatch = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
    (
        DeltaTable.forPath(spark, _deletes_path(config, table)).alias("t")
        .merge(removed.alias("s"), dmatch)
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )  # fmt: skip
    max_commit = int(summary["max_commit"]) if summary["max_commit"] is not None else None
    last_ts = summary["max_ts"].isoformat() if summary["max_ts"] is not None else None
    return count, max_commit, last_ts
