"""Current against one consistent read of the source, row by row, exactly, while both move.

Used by ``cdc-platform verify`` and by the completeness check. The steps, in this order
(the order is what makes it exact):

1. Read the source into a scratch table (``snapshot.scratch_copy``). Its watermark gives
   the Kafka offsets taken just before the read: every event below them is older than
   the read.
2. Take the source's position after the read and wait until capture confirmed it: every
   event older than the read is now in Kafka. ``verify`` then also waits until current
   has applied the read's watermark offsets (the apply catches up while the source is
   read, instead of before), so only keys changed after the read are left out below.
3. **Pin current**: note its frontier in the ledger, then fix the Delta version it is
   read at. The ledger records a frontier only after its Delta commit, so the pinned
   version has applied at least that frontier. A stream apply that goes on merging
   while the comparison runs changes nothing the comparison reads.
4. Take the topic's end offsets: the pinned version applied nothing at or beyond them.
5. Leave out the keys with an event in the span between (lower of the frontier and the
   read's offsets) and (the end offsets) (``model.coverage.in_flight_ranges``). Every
   other key had the same value during the read and at the pinned version, so it must be
   equal on both sides: a lost, doubled or wrong change to it is found.

A new generation committed while this runs may have rebuilt current at the pinned
version from a watermark the frontier in step 3 does not describe: that round is not
compared (``PIN_MOVED``) and the caller asks again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.current import POSITION_COLUMNS
from cdc_platform.lake.history import position_after
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.snapshot import scratch_copy
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import in_flight_ranges
from cdc_platform.model.tables import TableSchema
from cdc_platform.sources.base import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SAMPLE = 5
REPEATED = "repeated in the source"  # a key the source holds more than once
PIN_MOVED = "not compared: a new generation is being applied to current; compare again once it is"


@dataclass
class RowComparison:
    """Two tables of one shape, row by row by key."""

    compared: int = 0  # keys both sides hold
    missing: int = 0  # rows in the source, not in current (a repeated key's rows beyond the first too)
    repeated: int = 0  # keys the source holds more than once: current keeps one row per key
    extra: int = 0  # in current, not in the source
    differing: int = 0  # in both, some column differs
    sample: list[str] = field(default_factory=list)


@dataclass
class ExactComparison:
    """The outcome of ``compare_at_one_read``: ``rows`` is None when it did not compare,
    and ``note`` says why."""

    note: str = ""
    confirmed: bool = True  # capture confirmed a source position taken after the read
    rows: RowComparison | None = None
    source_rows: int = 0
    current_rows: int = 0
    current_version: int = -1  # the Delta version of current compared
    in_flight_keys: int = 0  # keys left out: changed in the span the read could not pin
    in_flight_offsets: int = 0


@dataclass(frozen=True)
class PinnedCurrent:
    """Current at one Delta version, and a frontier that version has applied at least."""

    frame: DataFrame
    version: int
    frontier: dict[int, int]


def compare_at_one_read(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    capture_wait_s: float, max_in_flight_offsets: int | None = None, *, stop_when_unread: bool = False,
    wait_for_current: Callable[[dict[int, int]], str] | None = None,
) -> ExactComparison:  # fmt: skip
    """Current against one consistent read of the source (the module's steps); the
    in-flight span is decoded only up to ``max_in_flight_offsets`` (None: no cap);
    ``stop_when_unread``: see ``Source.wait_until_captured``. ``wait_for_current``, once
    capture confirmed the read: called with the read's watermark offsets, it waits until
    current applied them and returns why it did not ('' when it did); not compared then."""
    with scratch_copy(spark, source, kafka, table, "compare") as (truth, plan):
        after_read = source.position()
        if why := source.wait_until_captured(after_read, time.monotonic() + capture_wait_s, stop_when_unread):
            return ExactComparison(note=f"not compared: {why}", confirmed=False)
        if wait_for_current is not None and (why := wait_for_current(dict(plan.watermark.kafka_end_offsets))):
            return ExactComparison(note=why, confirmed=False)
        pinned = pin_current(spark, ledger, table)
        if pinned is None:
            return ExactComparison(note=PIN_MOVED)
        spans = in_flight_ranges(pinned.frontier, plan.watermark.kafka_end_offsets, kafka.end_offsets(table.topic))
        return _compare_pinned(spark, kafka, table, plan.schema, pinned, spans, max_in_flight_offsets, truth)


def compare_history(
    spark: SparkSession, ledger: Ledger, kafka: KafkaClients, table: LakeTable, schema: TableSchema,
    max_in_flight_offsets: int | None = None,
) -> ExactComparison:  # fmt: skip
    """History's open versions against current, row by row: each key current holds has one
    open version equal to it, and no other key has one. Current and history commit each
    batch separately (history's MERGE runs beside current's), so they are pinned after the
    ledger's frontier, which is recorded only once both committed: below it both applied
    every event, and the keys with an event at or after it are left out. ``rows`` compares
    history (as the "source") with current: 'missing' is an open version current lacks,
    'repeated in the source' a key with two open versions."""
    pinned = pin_current(spark, ledger, table)
    if pinned is None:
        return ExactComparison(note=PIN_MOVED)
    history = _pinned_history(spark, table)
    spans = in_flight_ranges(pinned.frontier, pinned.frontier, kafka.end_offsets(table.topic))
    # a column current has and history not yet (each table evolves as its changes arrive) is left out
    shared = [c for c in pinned.frame.columns if c in history.columns]
    open_versions = history.where("is_current").select(*[f"`{c}`" for c in shared])
    return _compare_pinned(spark, kafka, table, schema, pinned, spans, max_in_flight_offsets, open_versions)


@dataclass
class VersionChain:
    """History's versions of each key in the order of their start positions, each checked
    against the next (``history_chain``). Every batch commits whole, so these hold at every
    version of history, whatever is in flight."""

    versions: int = 0
    starting_twice: int = 0  # a version starting where another of its key starts: one event applied twice
    overlapping: int = 0  # ending after the next version starts, or open with a version after it
    without_end: int = 0  # closed without an end position or valid_to, or open with one
    misdated: int = 0  # ending before it starts, or a valid_to that is not the next version's valid_from
    sample: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return self.starting_twice + self.overlapping + self.without_end + self.misdated


def history_chain(spark: SparkSession, table: LakeTable, keys: list[str]) -> VersionChain:
    """Each key's versions, ordered by start position, must follow one another: one at a
    time (none open before the last, none ending after the next begins, no two starting at
    one position), each closed one with its end, and an update's version valid until the
    next one is valid from. The open versions' comparison with current cannot see a closed
    version gone wrong; this can. One pass over history with a window per key."""
    from pyspark.sql import functions as F

    # not cached: a clean history (the usual case) is read once; samples read it again only on a fault
    faults = _chain_faults(spark.read.format("delta").load(table.history_path), keys)
    totals = faults.agg(
        F.count(F.lit(1)).alias("versions"), *[F.sum(F.col(f).cast("int")).alias(f) for f in CHAIN_FAULTS]
    ).first()
    assert totals is not None
    found = [int(totals[f] or 0) for f in CHAIN_FAULTS]
    chain = VersionChain(int(totals["versions"]), found[0], found[1], found[2], found[3])
    for fault in CHAIN_FAULTS:
        if totals[fault]:
            chain.sample += key_samples(faults.where(F.col(fault)), keys, fault.replace("_", " "))
    return chain


CHAIN_FAULTS = ("starting_twice", "overlapping", "without_end", "misdated")


def _chain_faults(history: DataFrame, keys: list[str]) -> DataFrame:
    """Each version's keys and one boolean column per fault of ``CHAIN_FAULTS``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    in_key = Window.partitionBy(*[F.col(f"`{k}`") for k in keys]).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    positions = ("_cdc_commit_lsn", "_cdc_lsn", "_cdc_end_commit_lsn", "_cdc_end_lsn")
    start_c, start_l, end_c, end_l = (F.col(c) for c in positions)
    next_c, next_l, next_from = (F.col(f"__next_{c}") for c in ("c", "l", "from"))
    is_open, valid_to = F.col("is_current"), F.col("valid_to")
    ends = end_c.isNotNull() & end_l.isNotNull() & valid_to.isNotNull()
    twice = (next_c == start_c) & (next_l == start_l)
    faults = {
        "starting_twice": twice,
        "overlapping": next_c.isNotNull() & ~twice & (is_open | position_after(end_c, end_l, next_c, next_l)),
        "without_end": F.when(is_open, end_c.isNotNull() | end_l.isNotNull() | valid_to.isNotNull()).otherwise(~ends),
        "misdated": position_after(start_c, start_l, end_c, end_l)
        | (valid_to < F.col("valid_from"))
        | ((end_c == next_c) & (end_l == next_l) & (valid_to != next_from)),
    }
    return history.select(
        *[F.col(f"`{k}`") for k in keys],
        start_c,
        start_l,
        end_c,
        end_l,
        is_open,
        "valid_from",
        valid_to,
        F.lead(start_c).over(in_key).alias("__next_c"),
        F.lead(start_l).over(in_key).alias("__next_l"),
        F.lead("valid_from").over(in_key).alias("__next_from"),
    ).select(*[F.col(f"`{k}`") for k in keys], *[F.coalesce(f, F.lit(False)).alias(n) for n, f in faults.items()])


def _compare_pinned(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, schema: TableSchema, pinned: PinnedCurrent,
    spans: list[tuple[int, int, int]], max_in_flight_offsets: int | None, side: DataFrame,
) -> ExactComparison:  # fmt: skip
    """``side`` (a source read, history's open versions) against pinned current, the keys
    with an event in ``spans`` left out: not compared above ``max_in_flight_offsets`` (the
    span is decoded) or with a truncate in the span (every key is in flight then)."""
    result = ExactComparison(current_version=pinned.version)
    result.in_flight_offsets = sum(end - start for _, start, end in spans)
    if max_in_flight_offsets is not None and result.in_flight_offsets > max_in_flight_offsets:
        result.note = (
            f"not compared: {result.in_flight_offsets} offsets in flight (beyond current's frontier, or since the "
            f"source read, to the end of the topic) exceed completeness.max_in_flight_offsets={max_in_flight_offsets}; "
            "apply current more often, or raise the cap"
        )
        return result
    moved = in_flight_keys(spark, kafka, table, spans, schema)
    if moved is None:
        result.note = "not compared: a truncate is in flight; compare after it is applied"
        return result
    try:
        result.source_rows, result.current_rows = side.count(), pinned.frame.count()
        result.in_flight_keys = moved.count()
        result.rows = compare_rows(side, pinned.frame, list(schema.key), moved)
    finally:
        moved.unpersist()
    return result


def _pinned_history(spark: SparkSession, table: LakeTable) -> DataFrame:
    """History at its latest Delta version, fixed now (after current's pin)."""
    from delta.tables import DeltaTable

    version = int(DeltaTable.forPath(spark, table.history_path).history(1).select("version").collect()[0][0])
    return spark.read.format("delta").option("versionAsOf", version).load(table.history_path)


def pin_current(spark: SparkSession, ledger: Ledger, table: LakeTable) -> PinnedCurrent | None:
    """Current at its latest Delta version, with the frontier the ledger recorded before
    that version was fixed (so the version applied at least that much); None while a
    generation newer than current's is committed (current may be rebuilt from it)."""
    from delta.tables import DeltaTable

    before = ledger.current(table.key)
    if before is None:
        return None
    version = int(DeltaTable.forPath(spark, table.current_path).history(1).select("version").collect()[0][0])
    committed = ledger.committed(table.key)
    if committed is None or committed.generation != before.generation:
        return None
    frame = spark.read.format("delta").option("versionAsOf", version).load(table.current_path)
    return PinnedCurrent(frame.drop(*POSITION_COLUMNS), version, dict(before.frontier))


def in_flight_keys(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, spans: list[tuple[int, int, int]],
    schema: TableSchema,
) -> DataFrame | None:  # fmt: skip
    """The keys (old and new) of every event in ``spans``, cached, decoded once; None when
    a truncate is among them (every key is in flight then)."""
    from pyspark.sql import functions as F

    from cdc_platform.lake.changelog import read_offsets

    keys = list(schema.key)
    events = read_offsets(spark, kafka, table, spans, schema)
    # one decoding pass: each event's old and new key, truncates marked by a null-key row
    truncate = F.col("op") == "t"
    images = [
        events.select(truncate.alias("_truncate"), *[F.col(image).getField(k).alias(k) for k in keys])
        for image in ("before", "after")
    ]
    marked = images[0].unionByName(images[1]).where("_truncate OR " + " OR ".join(f"`{k}` IS NOT NULL" for k in keys))
    moved = marked.distinct().cache()
    if moved.where("_truncate").limit(1).count():
        moved.unpersist()
        return None
    return moved  # _truncate is false on every row left; joins on the keys ignore it


def compare_rows(
    source: DataFrame, current: DataFrame, keys: list[str], leave_out: DataFrame | None = None
) -> RowComparison:
    """``source`` against ``current`` (its columns; columns the source dropped are not
    compared) by key, except the keys in ``leave_out``: a hash of every column on each
    side, with a null marker per column so a value moved between columns is a
    difference. A key the source holds twice is a row current cannot hold, even when
    the two rows are alike, so its rows beyond the first count as missing. Samples:
    'missing'/'extra'/'differs'/'repeated in the source'."""
    from pyspark.sql import functions as F

    columns = list(source.columns)

    def hashed(frame: DataFrame) -> DataFrame:
        kept = frame if leave_out is None else frame.join(leave_out, keys, "left_anti")
        parts = [p for c in columns for p in (F.col(f"`{c}`"), F.col(f"`{c}`").isNull())]
        return kept.select(*[f"`{k}`" for k in keys], F.xxhash64(*parts).alias("_row_hash"))

    # one row per key; the aggregation's shuffle is the one the join needs anyway
    per_key = hashed(source).groupBy(*[f"`{k}`" for k in keys])
    left = per_key.agg(F.min("_row_hash").alias("_source"), F.count(F.lit(1)).alias("_copies"))
    right = hashed(current.select(*[f"`{c}`" for c in columns])).withColumnRenamed("_row_hash", "_current")
    joined = left.join(right, keys, "full_outer").cache()
    try:
        verdict = F.when(F.col("_current").isNull(), "missing").when(F.col("_source").isNull(), "extra")
        verdict = verdict.when(F.col("_copies") > 1, REPEATED)
        verdict = verdict.when(F.col("_source") != F.col("_current"), "differs").otherwise("equal")
        counted = joined.groupBy(verdict.alias("v")).agg(
            F.count(F.lit(1)).alias("keys"), F.sum("_copies").alias("rows")
        )
        keys_by = {str(r["v"]): (int(r["keys"]), int(r["rows"] or 0)) for r in counted.collect()}
        result = _comparison(keys_by)
        for label in (REPEATED, "differs", "missing", "extra"):
            if label in keys_by:
                result.sample += key_samples(joined.where(verdict == label), keys, label)
        return result
    finally:
        joined.unpersist()


def _comparison(by_verdict: dict[str, tuple[int, int]]) -> RowComparison:
    """From (keys, source rows) per verdict: a repeated key's rows beyond the first are missing."""
    keys = {verdict: counts[0] for verdict, counts in by_verdict.items()}
    rows = {verdict: counts[1] for verdict, counts in by_verdict.items()}
    repeated = keys.get(REPEATED, 0)
    return RowComparison(
        compared=keys.get("equal", 0) + keys.get("differs", 0) + repeated,
        missing=rows.get("missing", 0) + rows.get(REPEATED, 0) - repeated,
        extra=keys.get("extra", 0),
        differing=keys.get("differs", 0),
        repeated=repeated,
    )


def keys_only_in(frame: DataFrame, other: DataFrame, keys: list[str], label: str) -> tuple[int, list[str]]:
    """How many keys of ``frame`` ``other`` does not hold, with samples labelled ``label``."""
    only = frame.select(*[f"`{k}`" for k in keys]).join(other, keys, "left_anti").cache()
    try:
        return only.count(), key_samples(only, keys, label)
    finally:
        only.unpersist()


def repeated_keys(frame: DataFrame, keys: list[str]) -> tuple[int, list[str]]:
    """How many keys ``frame`` holds more than once, with samples: rows a table keyed on
    ``keys`` cannot all hold."""
    from pyspark.sql import functions as F

    repeated = frame.groupBy(*[f"`{k}`" for k in keys]).count().where(F.col("count") > 1).cache()
    try:
        return repeated.count(), key_samples(repeated, keys, REPEATED)
    finally:
        repeated.unpersist()


def key_samples(frame: DataFrame, keys: list[str], label: str) -> list[str]:
    """Up to SAMPLE rows of ``frame`` as '<label> {"key": value, …}' for check metadata."""
    return [f"{label} {json.dumps({k: plain_value(r[k]) for k in keys})}" for r in frame.limit(SAMPLE).collect()]


def plain_value(value: Any) -> Any:
    return value if isinstance(value, int | str | float | bool) or value is None else str(value)
