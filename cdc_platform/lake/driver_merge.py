"""A small batch into a small current, merged in the driver by delta-rs instead of Spark.

Delta's MERGE in Spark costs ~25 Spark jobs and 1.2-3 s whatever the batch's size (their
planning, code generation and commit on the driver; docs/benchmarks.md, "Per-batch fixed
cost of the merge"). For a current of up to ``DRIVER_MERGE_MAX_ROWS`` rows, delta-rs
(Rust, DataFusion, in this process) merges the same batch in 0.05-0.2 s: it rewrites the
touched files (copy on write), which at this size costs less than Spark's planning.
Bigger currents keep Spark's MERGE with deletion vectors, whose cost follows the changes,
unless ``lake.driver_merge_max_rows`` is raised: 10k changes into 10M rows then take ~2.6 s
against Spark's 5-8 s, and each batch rewrites every file it touches.

The batch is what Spark's MERGE gets, one row per key: ``latest_in_driver`` from the
batch's events in Arrow, or ``_latest_per_key`` (and the resurrection guard) in Spark
collected to Arrow (at most ``DRIVER_MERGE_MAX_CHANGES`` rows); it is merged with the same
clauses: an event at or before a row's position is ignored, a delete removes the row, an
update keeps every column the batch did not carry (TOAST), a key current lacks is inserted
unless its latest event deletes it.

Only for tables whose Delta features delta-rs writes as Spark does (``WRITABLE_FEATURES``),
never after a truncate (Spark deletes by position first), and never for column names the
SQL expressions would have to escape (a table with other features is said once, at info).
Whatever delta-rs raises makes Spark merge the batch and the table from then on, with one
warning. An error before delta-rs' commit wrote
nothing; one after it (a post-commit checkpoint) leaves a batch that Spark's MERGE then
finds applied: every event is at or before its row's position, so it changes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.checksums import drop_stale_checkpoint_checksum
from cdc_platform.lake.tables import LakeTable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("cdc_platform.current")

# current's rows up to which the driver merges unless lake.driver_merge_max_rows says otherwise
# (copy on write: 20 changes into 100k rows 0.05 s, into 1M rows 0.2 s, against 2.1 and 2.9 s
# through Spark; docs/benchmarks.md). Higher, every batch rewrites more: a user's choice.
DRIVER_MERGE_MAX_ROWS = 1_000_000
# a batch's changes up to which the driver merges: the default batch (apply.max_offsets_per_batch).
# What it collects is one row per key (the latest event), at most this many; a 200k-change
# batch into a 100k-row current merged in 3.1 s against Spark's 5.9 s (docs/benchmarks.md).
DRIVER_MERGE_MAX_CHANGES = 200_000
# events up to which the latest per key is computed in Arrow from the whole events (both
# images) collected to the driver; a bigger batch is aggregated by Spark first
DRIVER_EVENTS_MAX = 10_000
# Delta table features delta-rs keeps as Spark writes them (deletion vectors: read, and
# dropped with the rewritten files). Column mapping, constraints, generated columns: Spark.
WRITABLE_FEATURES = frozenset({"deletionVectors", "appendOnly", "invariants", "timestampNtz"})

# tables (current, changelog) delta-rs refused once, and why: Spark writes them from then on
refused: dict[str, str] = {}
spark_only: set[str] = set()  # tables with Delta features delta-rs does not write
_refused_lock = threading.Lock()


@dataclass(frozen=True)
class DriverMergeMetrics:
    inserted: int
    deleted: int


def merges_in_driver(
    table: LakeTable, current_rows: int | None, changes: int, truncates: bool, names: list[str]
) -> bool:
    """Whether this batch of ``changes`` events merges into current (of ``names``) in the driver."""
    bound = driver_merge_bound(table)
    if truncates or current_rows is None or current_rows > bound or bound == 0:
        return False
    if changes > DRIVER_MERGE_MAX_CHANGES or not driver_writes(table.current_path):
        return False
    return all(plain_name(c) for c in names)


def driver_merge_bound(table: LakeTable) -> int:
    """The most rows a current may hold to take batches in the driver (``lake.driver_merge_max_rows``)."""
    return DRIVER_MERGE_MAX_ROWS if table.driver_merge_max_rows is None else table.driver_merge_max_rows


def events_collected_whole(changes: int) -> bool:
    """Whether a batch of ``changes`` events the driver does not hold yet is collected whole
    (both images) for ``latest_in_driver``; a bigger one is aggregated by Spark first and
    collected one row per key (``collected_latest``)."""
    return changes <= DRIVER_EVENTS_MAX


def merge_in_driver(
    table: LakeTable, batch: pa.Table, keys: list[str], columns: list[str], remember_deletes: bool
) -> DriverMergeMetrics | None:
    """``batch`` (one row per key: ``latest_in_driver`` or ``collected_latest``) merged into
    current by delta-rs; then, when the batch deletes, the deleted keys appended to the
    deletes table. None when delta-rs refused before writing: the caller merges through Spark."""
    from deltalake import DeltaTable

    if batch.num_rows == 0:
        return DriverMergeMetrics(0, 0)
    target = DeltaTable(table.current_path)
    if not delta_rs_writes(target, table.key, table.current_path, "current merged"):
        return None
    try:
        metrics = _merge(target, batch, keys, columns)
    except Exception as exc:  # Spark merges instead (a merge again is harmless: see the module's docstring)
        refuse(table.key, table.current_path, "current merged", f"{type(exc).__name__}: {exc}")
        return None
    drop_stale_checkpoint_checksum(table.current_path)
    if remember_deletes:
        _append_deletes(table, batch, keys)
    return metrics


def collected_latest(latest: DataFrame, keys: list[str], columns: list[str]) -> pa.Table:
    """Spark's latest event per key (``current._latest_per_key``) collected, one row per key
    with plain columns: ``__key_i``, ``__op``, ``__commit``, ``__lsn``, and per column
    ``__has_i`` (the batch carried a value) and ``__val_i``."""
    from pyspark.sql import functions as F

    flat = latest.select(
        *[F.col(f"`__key_{k}`").alias(f"__key_{i}") for i, k in enumerate(keys)],
        F.col("op").alias("__op"),
        F.col("__order.commit_lsn").alias("__commit"),
        F.col("__order.lsn").alias("__lsn"),
        *[F.col(f"`__v_{c}`").isNotNull().alias(f"__has_{i}") for i, c in enumerate(columns)],
        *[F.col(f"`__v_{c}`.v").alias(f"__val_{i}") for i, c in enumerate(columns)],
    )
    return flat.toArrow()


def latest_in_driver(changes: pa.Table, keys: list[str], columns: list[str]) -> pa.Table | None:
    """What ``collected_latest`` gives, computed in Arrow from the batch's change events
    (changelog columns): per key, the latest op and position by (commit LSN, LSN, Kafka
    partition, offset), and per column the latest value among the events that carried it
    (not TOASTed, not a delete). None when a key column's type is one Arrow's grouping does
    not compare as Spark's does (floating point: Spark takes -0.0 = 0.0 and NaN = NaN), or
    when a column is not in the events' images: then Spark computes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    image_type = changes.schema.field("after").type
    names = {image_type.field(i).name: image_type.field(i).type for i in range(image_type.num_fields)}
    if not all(k in names and groupable(names[k]) for k in keys) or not all(c in names for c in columns):
        return None
    events = changes.filter(pc.not_equal(changes["op"], "t"))
    if events.num_rows == 0:  # Arrow's kernels refuse columns without chunks; Spark's aggregation takes it
        return None
    rows = events.take(pc.sort_indices(events, [(c, "ascending", "at_start") for c in EVENT_ORDER]))
    rank = pa.array(range(rows.num_rows), pa.int64())  # a row's place in the events' order
    delete = pc.equal(rows["op"], "d")
    after = rows["after"]
    grouped = {
        f"__key_{i}": pc.if_else(delete, pc.struct_field(rows["before"], k), pc.struct_field(after, k))
        for i, k in enumerate(keys)
    }
    grouped["__rank"] = rank
    unavailable = rows["unavailable"].combine_chunks()
    parents, listed = pc.list_parent_indices(unavailable), pc.list_flatten(unavailable)
    for i, c in enumerate(columns):
        toasted = pc.is_in(rank, value_set=parents.filter(pc.equal(listed, c)))
        carried = pc.and_not(pc.invert(toasted), delete)
        grouped[f"__rank_{i}"] = pc.if_else(carried, rank, pa.scalar(None, pa.int64()))
    key_names = [f"__key_{i}" for i in range(len(keys))]
    latest = (
        pa.table(grouped)
        .group_by(key_names, use_threads=False)
        .aggregate([("__rank", "max"), *[(f"__rank_{i}", "max") for i in range(len(columns))]])
    )
    last = latest["__rank_max"]
    out = {name: latest[name] for name in key_names}
    out |= {"__op": rows["op"].take(last), "__commit": rows["commit_lsn"].take(last), "__lsn": rows["lsn"].take(last)}
    out |= {f"__has_{i}": pc.is_valid(latest[f"__rank_{i}_max"]) for i in range(len(columns))}
    out |= {f"__val_{i}": pc.struct_field(after, c).take(latest[f"__rank_{i}_max"]) for i, c in enumerate(columns)}
    return pa.table(out)


EVENT_ORDER = ("commit_lsn", "lsn", "kafka_partition", "kafka_offset")  # current._latest_per_key's ``__order``


def collected_events(batch: DataFrame, columns: Sequence[str] = ()) -> pa.Table:
    """The columns of a frame of change events that ``latest_in_driver`` reads (or
    ``columns``), collected. Cast to types whose every field may be NULL first: PySpark's
    ``toArrow`` refuses a NULL image whose type has a field Spark knows is never NULL (a literal, say)."""
    from pyspark.sql import functions as F

    fields = {f.name: f.dataType for f in batch.schema.fields}
    return batch.select(*[F.col(c).cast(_nullable(fields[c])).alias(c) for c in columns or EVENT_COLUMNS]).toArrow()


EVENT_COLUMNS = ("op", "commit_lsn", "lsn", "kafka_partition", "kafka_offset", "before", "after", "unavailable")


def _nullable(kind: Any) -> Any:
    from pyspark.sql import types as T

    if isinstance(kind, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in kind.fields])
    if isinstance(kind, T.ArrayType):
        return T.ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, T.MapType):
        return T.MapType(kind.keyType, _nullable(kind.valueType), True)
    return kind


def groupable(kind: pa.DataType) -> bool:
    """A key type Arrow's hash grouping compares as Spark's ``groupBy`` does: by value."""
    import pyarrow as pa

    t = pa.types
    return any(
        check(kind)
        for check in (t.is_integer, t.is_string, t.is_large_string, t.is_binary, t.is_large_binary, t.is_decimal,
                      t.is_date, t.is_timestamp, t.is_boolean)
    )  # fmt: skip


def _merge(target: Any, batch: pa.Table, keys: list[str], columns: list[str]) -> DriverMergeMetrics:
    match = " AND ".join(f'(t."{k}" IS NOT DISTINCT FROM s."__key_{i}")' for i, k in enumerate(keys))
    newer = '(s."__commit" > t."_cdc_commit_lsn" OR (s."__commit" = t."_cdc_commit_lsn" AND s."__lsn" > t."_cdc_lsn"))'
    position = {"_cdc_commit_lsn": 's."__commit"', "_cdc_lsn": 's."__lsn"'}
    updates = {c: f'CASE WHEN s."__has_{i}" THEN s."__val_{i}" ELSE t."{c}" END' for i, c in enumerate(columns)}
    inserts = {c: f's."__val_{i}"' for i, c in enumerate(columns)}
    result = (
        target.merge(source=batch, predicate=match, source_alias="s", target_alias="t")
        .when_matched_delete(predicate=f"s.\"__op\" = 'd' AND {newer}")
        .when_matched_update(updates={**updates, **position}, predicate=f"s.\"__op\" <> 'd' AND {newer}")
        .when_not_matched_insert(updates={**inserts, **position}, predicate="s.\"__op\" <> 'd'")
        .execute()
    )
    return DriverMergeMetrics(
        int(result.get("num_target_rows_inserted", 0)), int(result.get("num_target_rows_deleted", 0))
    )


def _append_deletes(table: LakeTable, batch: pa.Table, keys: list[str]) -> None:
    """The deleted keys and their positions, appended as ``_remember_deletes`` appends them."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    removed = batch.filter(pc.equal(batch["__op"], "d"))
    if removed.num_rows == 0:
        return
    names = [*keys, "_cdc_commit_lsn", "_cdc_lsn"]
    data = removed.select([*[f"__key_{i}" for i in range(len(keys))], "__commit", "__lsn"]).rename_columns(names)
    write_deltalake(table.deletes_path, data.cast(arrow_schema_of(DeltaTable(table.deletes_path))), mode="append")
    drop_stale_checkpoint_checksum(table.deletes_path)


def arrow_schema_of(target: Any) -> pa.Schema:
    """A delta-rs table's schema in pyarrow (delta-rs hands an arro3 schema; pyarrow reads it
    through the Arrow C interface)."""
    import pyarrow as pa

    return pa.schema(target.schema().to_arrow())


def delta_rs_writes(target: Any, key: str, path: str, what: str) -> bool:
    """Whether delta-rs writes the Delta table ``target`` (at ``path``) as Spark does: its
    writer features are all ``WRITABLE_FEATURES``. Otherwise Spark writes it from then on,
    by design and not a failure, said once at info (``what``: e.g. "current merged")."""
    features = set(target.protocol().writer_features or [])
    if features <= WRITABLE_FEATURES:
        return True
    with _refused_lock:
        known = path in spark_only
        spark_only.add(path)
    if not known:
        log.info(
            "%s: %s through Spark (its Delta features %s are written by Spark only)",
            key, what, sorted(features - WRITABLE_FEATURES),
        )  # fmt: skip
    return False


def refuse(key: str, path: str, what: str, reason: str) -> None:
    """delta-rs failed to write the table at ``path``: Spark writes it from now on, said once as a warning."""
    with _refused_lock:
        if path in refused or path in spark_only:
            return
        refused[path] = reason
    log.warning("%s: %s through Spark from now on (delta-rs in the driver refused: %s)", key, what, reason)


def driver_writes(path: str) -> bool:
    """Whether the driver may still write the table at ``path`` with delta-rs."""
    return path not in refused and path not in spark_only


def plain_name(name: str) -> bool:
    """A column name the merge's SQL can quote as it is."""
    return '"' not in name and "`" not in name
