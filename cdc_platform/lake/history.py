"""History: SCD type 2 versions of every row (``valid_from`` / ``valid_to`` / ``is_current``).

Written from the same change batches as current (same frontier, same run), so both
always describe the same position. Each row version carries the source position that
created it (``_cdc_commit_lsn``, ``_cdc_lsn``) and, once closed, the one that closed it
(``_cdc_end_commit_lsn``, ``_cdc_end_lsn``).

* **Versions.** Every ``c``/``u``/``r`` event opens a version; the next event of the same
  key (update or delete) closes it at that event's commit time. ``valid_from`` and
  ``valid_to`` are source commit times (``source.ts_ms``); several changes of one row in
  one transaction share a commit time, so their versions have ``valid_from == valid_to``
  and the positions order them.
* **Duplicates.** An event at or before the key's last known position (the newest start
  or end position in history) is ignored, so at-least-once redelivery and re-applied
  windows never add versions.
* **New generation.** History is never thrown away. Current is rebuilt and replays the
  changes from the watermark offsets (history drops those it already has); then current
  and the open versions are compared: changed or new rows open a version (``_cdc_op =
  'r'``), as does a key with two open versions (its correction closes both), open keys
  current lacks are closed. A correction is positioned just after the
  key's newest known position (so the key's next streamed change follows it), a key new
  to history below every streamed change; it is valid from the watermark time or, if
  later, the key's last known time.
* **TOAST.** An unchanged TOASTed column keeps the previous version's value.
* **Truncate.** Closes every open version older than it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.tables import table_options

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

HISTORY_META = (
    ("valid_from", "timestamp"),
    ("valid_to", "timestamp"),
    ("is_current", "boolean"),
    ("_cdc_op", "string"),
    ("_cdc_commit_lsn", "bigint"),
    ("_cdc_lsn", "bigint"),
    ("_cdc_end_commit_lsn", "bigint"),
    ("_cdc_end_lsn", "bigint"),
)
HISTORY_META_COLUMNS = tuple(name for name, _ in HISTORY_META)


@dataclass
class HistoryResult:
    versions_opened: int
    versions_closed: int

    def plus(self, other: HistoryResult) -> HistoryResult:
        return HistoryResult(self.versions_opened + other.versions_opened, self.versions_closed + other.versions_closed)


def ensure_history_table(
    spark: SparkSession, path: str, row_type: StructType, properties: dict[str, str] | None = None
) -> None:
    """An empty history table of ``row_type``'s columns, unless there is one; ``properties``:
    Delta table properties of a new one (deletion vectors, auto compaction)."""
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        return
    columns = [f"`{f.name}` {f.dataType.simpleString()}" for f in row_type.fields]
    ddl = ", ".join(columns + [f"{name} {kind}" for name, kind in HISTORY_META])
    empty = spark.createDataFrame([], ddl)
    empty.write.format("delta").mode("overwrite").options(**table_options(empty.schema), **(properties or {})).save(
        path
    )


def snapshot_events(
    spark: SparkSession, path: str, rows: DataFrame, keys: list[str], watermark_lsn: int, taken_at: str
) -> DataFrame:
    """Corrections that make history's open versions equal ``rows``: changed/new rows (and
    rows whose key has two open versions) as ``r``, vanished open keys as ``d``, each just
    after its key's newest known position (``(0, watermark LSN)`` for a key new to history)."""
    from pyspark.sql import functions as F

    columns = rows.columns
    history = spark.read.format("delta").load(path)
    open_rows = history.where("is_current").select(*columns)
    # a key with two open versions is corrected even if one equals its row: its 'r' closes both
    twice = open_rows.groupBy(*[F.col(f"`{k}`") for k in keys]).count().where(F.col("count") > 1).drop("count")
    to_correct = rows.exceptAll(open_rows).select(*[F.col(f"`{k}`") for k in keys]).unionByName(twice).distinct()
    changed = rows.join(to_correct, on=keys, how="left_semi")
    present = rows.select(*keys).alias("s")
    vanished = (
        open_rows.alias("o")
        .join(present, on=[F.col(f"o.`{k}`").eqNullSafe(F.col(f"s.`{k}`")) for k in keys], how="left_anti")
        .select(*[F.col(f"o.`{c}`") for c in columns])
    )
    newest = F.struct(
        F.coalesce("_cdc_end_commit_lsn", "_cdc_commit_lsn").alias("c"),
        F.coalesce("_cdc_end_lsn", "_cdc_lsn").alias("l"),
    )
    last = history.groupBy(*[F.col(k).alias(f"__last_{k}") for k in keys]).agg(
        F.max(newest).alias("__last"), F.max(F.coalesce("valid_to", "valid_from")).alias("__last_ts")
    )
    at = F.to_timestamp(F.lit(taken_at))
    image = F.struct(*[F.col(c) for c in columns])
    common = [
        F.coalesce(F.col("__last.c"), F.lit(0)).cast("long").alias("commit_lsn"),
        F.coalesce(F.col("__last.l") + 1, F.lit(watermark_lsn)).cast("long").alias("lsn"),
        F.lit(-1).alias("kafka_partition"),
        F.lit(-1).cast("long").alias("kafka_offset"),
        F.greatest(at, F.coalesce(F.col("__last_ts"), at)).alias("source_ts"),
        F.lit(None).cast("array<string>").alias("unavailable"),
    ]
    null_image = F.lit(None).cast(rows.schema)

    def positioned(frame: DataFrame) -> DataFrame:
        return frame.join(last, on=[F.col(f"`{k}`").eqNullSafe(F.col(f"__last_{k}")) for k in keys], how="left")

    reads = positioned(changed).select(
        F.lit("r").alias("op"), *common, null_image.alias("before"), image.alias("after")
    )
    gone = positioned(vanished).select(
        F.lit("d").alias("op"), *common, image.alias("before"), null_image.alias("after")
    )
    return reads.unionByName(gone)


def apply_history(
    spark: SparkSession, path: str, events: DataFrame, keys: list[str], columns: list[str], truncates: bool = True
) -> HistoryResult:
    """Apply change events (columns as in the changelog: op, commit_lsn, lsn, kafka_partition,
    kafka_offset, source_ts, before, after, unavailable) to the history table at ``path``.
    ``truncates``: False when the caller knows the events hold no truncate (one Spark job
    fewer a batch: the stream apply's batch summary says so)."""
    from pyspark.sql import functions as F

    events = events.select(
        "op", "commit_lsn", "lsn", "kafka_partition", "kafka_offset", "source_ts", "before", "after", "unavailable"
    ).cache()
    try:
        if truncates:
            truncates_in_order = (
                events.where(F.col("op") == "t").select("commit_lsn", "lsn", "source_ts").orderBy("commit_lsn", "lsn")
            ).collect()
        else:
            truncates_in_order = []
        opened = closed = 0
        lower: tuple[int, int] | None = None
        # segments between truncates (truncates are rare; usually this is one segment)
        for t in [*truncates_in_order, None]:
            segment = events.where(F.col("op") != "t")
            if lower is not None:
                segment = segment.where(events_after(lower))
            if t is not None:
                segment = segment.where(~events_after((t["commit_lsn"], t["lsn"])))
            o, c = _apply_segment(spark, path, segment, keys, columns)
            opened, closed = opened + o, closed + c
            if t is not None:
                closed += _close_all_before(spark, path, t["commit_lsn"], t["lsn"], t["source_ts"])
                lower = (t["commit_lsn"], t["lsn"])
        return HistoryResult(opened, closed)
    finally:
        events.unpersist()


def events_after(position: tuple[int, int]) -> Column:
    """Change events (changelog columns) after ``position`` (commit LSN, LSN)."""
    from pyspark.sql import functions as F

    commit, lsn = position
    return position_after(F.col("commit_lsn"), F.col("lsn"), F.lit(commit), F.lit(lsn))


def position_after(commit: Column, lsn: Column, other_commit: Column, other_lsn: Column) -> Column:
    """Source position (commit, lsn) after (other_commit, other_lsn): commit LSN first."""
    return (commit > other_commit) | ((commit == other_commit) & (lsn > other_lsn))


def _close_all_before(spark: SparkSession, path: str, commit: int, lsn: int, ts: object) -> int:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    target = DeltaTable.forPath(spark, path)
    older = F.col("is_current") & position_after(F.lit(commit), F.lit(lsn), F.col("_cdc_commit_lsn"), F.col("_cdc_lsn"))
    count = target.toDF().where(older).count()
    target.update(
        older,
        {
            "valid_to": F.greatest(F.lit(ts).cast("timestamp"), F.col("valid_from")),  # times never go back
            "is_current": F.lit(False),
            "_cdc_end_commit_lsn": F.lit(commit).cast("long"),
            "_cdc_end_lsn": F.lit(lsn).cast("long"),
        },
    )
    return count


def _apply_segment(
    spark: SparkSession, path: str, events: DataFrame, keys: list[str], columns: list[str]
) -> tuple[int, int]:
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(spark, path)
    # Materialized once, its lineage cut: Delta's MERGE analyses its source's plan several
    # times, and this one (history's scan, joins, a window per column) cost more to plan
    # than to run. A cached frame keeps its plan; a local checkpoint does not (a 20-change
    # batch into 100k versions: 5.0-6.1 -> 3.1-4.0 s, docs/benchmarks.md).
    sequenced = _sequence(_unseen_events(target.toDF(), events, keys, columns), keys, columns).localCheckpoint(
        eager=True
    )
    try:
        opened, closed = _counts(sequenced)
        if opened == 0 and closed == 0:
            return 0, 0
        changes = _version_rows(sequenced, keys, columns).unionByName(_close_rows(sequenced, keys, columns))
        _merge_versions(target, changes, keys, columns)
        return opened, closed
    finally:
        _release_checkpoint(sequenced)


def _release_checkpoint(frame: DataFrame) -> None:
    """Free a local checkpoint's blocks now, not when the driver's garbage collector gets
    to its RDD: a long-running apply checkpoints every batch of a table with history."""
    plan = frame._jdf.queryExecution().logical()  # a LogicalRDD over the checkpointed RDD
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def _unseen_events(history: DataFrame, events: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
    """Events newer than their key's newest known position (duplicates dropped), with the
    key's open version (for TOAST values) and whether it has one."""
    from pyspark.sql import functions as F

    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    key_cols = [f"__key_{k}" for k in keys]
    keyed = events.select("*", *[image[k].alias(f"__key_{k}") for k in keys])
    # at-least-once duplicates: one event per (key, position)
    keyed = keyed.dropDuplicates([*key_cols, "commit_lsn", "lsn"])
    newest = F.struct(
        F.coalesce("_cdc_end_commit_lsn", "_cdc_commit_lsn").alias("c"),
        F.coalesce("_cdc_end_lsn", "_cdc_lsn").alias("l"),
    )
    open_version = F.max_by(
        F.struct(*[F.col(c) for c in columns]), F.when(F.col("is_current"), F.col("_cdc_commit_lsn"))
    )
    # only the batch's keys: the cost follows the batch, not the history's length
    batch_keys = keyed.select(*[F.col(f"__key_{k}").alias(k) for k in keys]).distinct()
    history = history.join(F.broadcast(batch_keys), on=keys, how="left_semi")
    last = history.groupBy(*[F.col(k).alias(f"__key_{k}") for k in keys]).agg(
        F.max(newest).alias("__last"),
        open_version.alias("__open"),
        F.max(F.col("is_current").cast("int")).alias("__has_open_version"),
        F.max(F.coalesce("valid_to", "valid_from")).alias("__last_ts"),
    )
    return keyed.join(last, on=key_cols, how="left").where(
        F.col("__last").isNull()
        | (F.col("commit_lsn") > F.col("__last.c"))
        | ((F.col("commit_lsn") == F.col("__last.c")) & (F.col("lsn") > F.col("__last.l")))
    )


def _sequence(keyed: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
    """Each key's events in order, with carried (TOAST) values and the next event's position.
    An event's time is never before its key's last time (in history, or earlier in the batch):
    a generation's correction is dated at its snapshot, and an event the snapshot already held
    (committed just before it, delivered after its watermark) follows it in position; dated
    at its commit, it would end the correction before it began."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key_cols = [f"__key_{k}" for k in keys]
    w = Window.partitionBy(*key_cols).orderBy("commit_lsn", "lsn", "kafka_partition", "kafka_offset")
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # greatest() skips nulls: a key new to history has no last time
    keyed = keyed.withColumn("source_ts", F.greatest(F.max("source_ts").over(upto), F.col("__last_ts")))
    values = []
    for c in columns:
        available = ~F.coalesce(F.array_contains("unavailable", c), F.lit(False)) & (F.col("op") != "d")
        carried = F.last(F.when(available, F.struct(F.col("after")[c].alias("v"))), ignorenulls=True).over(upto)
        values.append(F.coalesce(carried, F.struct(F.col("__open")[c].alias("v")))["v"].alias(c))
    return keyed.select(
        *key_cols,
        "op",
        "commit_lsn",
        "lsn",
        "source_ts",
        F.coalesce(F.col("__has_open_version"), F.lit(0)).alias("__has_open"),  # 0 for keys new to history
        *values,
        F.row_number().over(w).alias("__n"),
        F.lead("source_ts").over(w).alias("__next_ts"),
        F.lead("commit_lsn").over(w).alias("__next_commit"),
        F.lead("lsn").over(w).alias("__next_lsn"),
    )


def _counts(sequenced: DataFrame) -> tuple[int, int]:
    from pyspark.sql import functions as F

    counts = sequenced.agg(
        F.sum((F.col("op") != "d").cast("int")).alias("opened"),
        # open versions this batch closes, plus versions it opens and closes itself
        F.sum(
            ((F.col("__n") == 1) & (F.col("__has_open") == 1)).cast("int")
            + ((F.col("op") != "d") & F.col("__next_commit").isNotNull()).cast("int")
        ).alias("closed"),
    ).first()
    assert counts is not None
    return int(counts["opened"] or 0), int(counts["closed"] or 0)


def _version_rows(sequenced: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
    from pyspark.sql import functions as F

    return sequenced.where(F.col("op") != "d").select(
        F.lit("insert").alias("__kind"),
        *[F.col(f"__key_{k}").alias(f"__k_{k}") for k in keys],
        *[F.col(c) for c in columns],
        F.col("source_ts").alias("valid_from"),
        F.col("__next_ts").alias("valid_to"),
        F.col("__next_commit").isNull().alias("is_current"),
        F.col("op").alias("_cdc_op"),
        F.col("commit_lsn").alias("_cdc_commit_lsn"),
        F.col("lsn").alias("_cdc_lsn"),
        F.col("__next_commit").alias("_cdc_end_commit_lsn"),
        F.col("__next_lsn").alias("_cdc_end_lsn"),
    )


def _close_rows(sequenced: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
    """The open version of each key whose first new event closes it."""
    from pyspark.sql import functions as F

    return sequenced.where((F.col("__n") == 1) & (F.col("__has_open") == 1)).select(
        F.lit("close").alias("__kind"),
        *[F.col(f"__key_{k}").alias(f"__k_{k}") for k in keys],
        *[F.lit(None).alias(c) for c in columns],
        F.lit(None).cast("timestamp").alias("valid_from"),
        F.col("source_ts").alias("valid_to"),
        F.lit(False).alias("is_current"),
        F.lit(None).cast("string").alias("_cdc_op"),
        F.lit(None).cast("long").alias("_cdc_commit_lsn"),
        F.lit(None).cast("long").alias("_cdc_lsn"),
        F.col("commit_lsn").alias("_cdc_end_commit_lsn"),
        F.col("lsn").alias("_cdc_end_lsn"),
    )


def _merge_versions(target: Any, changes: DataFrame, keys: list[str], columns: list[str]) -> None:
    match = " AND ".join(f"t.`{k}` <=> s.`__k_{k}`" for k in keys) + " AND t.is_current AND s.__kind = 'close'"
    (
        target.alias("t")
        .merge(changes.alias("s"), match)
        .whenMatchedUpdate(
            set={
                "valid_to": "s.valid_to",
                "is_current": "false",
                "_cdc_end_commit_lsn": "s._cdc_end_commit_lsn",
                "_cdc_end_lsn": "s._cdc_end_lsn",
            }
        )
        .whenNotMatchedInsert(
            condition="s.__kind = 'insert'",
            values={f"`{c}`": f"s.`{c}`" for c in [*columns, *HISTORY_META_COLUMNS]},
        )
        .execute()
    )
