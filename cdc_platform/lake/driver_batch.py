"""A stream batch decoded into the driver: one Spark job instead of three.

A micro-batch whose decoded records fit ``lake.driver_batch_max_mb`` (``fits_in_driver``) is
read from Kafka and decoded by Spark SQL (``lake.jvm_decode``) in one Spark job whose rows
are collected to Arrow. The records Spark SQL cannot decode exactly go through the same
Python decoder here, in the driver, and the batch's statistics (counts by kind, positions,
times, the newest truncate, columns the schema lacks) are taken from the Arrow table.
delta-rs then appends the same table to the changelog and merges its latest event per key
into current (``lake.driver_append``, ``lake.driver_merge.latest_in_driver``).

Otherwise the batch caches the decoded rows and runs three Spark jobs on them: the
statistics, the changelog append, and an aggregation (with a shuffle) and a collect for
the merge: 0.3-0.4 s each on two cores for a small batch (docs/benchmarks.md, "Latency"),
and for a warm 200 000-change backlog batch 25-51 % of its time ("Stream apply
throughput"). A Spark frame of the same rows (``createDataFrame`` from the Arrow table:
Kafka is not read again) is still there for what Spark writes: a table's first append, a
schema change, dead letters, a big history, and Spark's MERGE into a big current.

How big a batch's records are in the driver is estimated before it is read: two images
of current's rows (the uncompressed bytes per row of current's largest Parquet file) plus
the change columns, and at least what the table's last batch held in the driver took. A
table with no estimate yet (no current file) holds batches of up to
``DRIVER_BATCH_MIN_RECORDS`` records, as before the bound was in bytes. The same bound
keeps what a driver merge or a driver append collects of a batch the driver does not hold
within the budget (``collects_in_driver``).

An estimate can be far too low: current's rows are narrow and a backfill writes wide
values. When the driver then cannot take what it collects (Spark refuses the job's results
above ``spark.driver.maxResultSize``, or Python runs out of memory), the batch goes on
through Spark's jobs and MERGE at once, and the table's batches stay there for
``ESTIMATE_TTL_S`` (``too_big``): retrying the same collect would stop the table.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from cdc_platform.lake.driver_append import DRIVER_APPEND_MAX_ROWS
from cdc_platform.lake.driver_merge import DRIVER_MERGE_MAX_CHANGES, driver_merge_bound
from cdc_platform.lake.object_store import pyarrow_uri
from cdc_platform.lake.tables import LakeTable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cdc_platform.envelope.encoding import ValueEncoding
    from cdc_platform.model.tables import TableSchema
    from cdc_platform.model.windows import WindowPlan

DRIVER_BATCH_MIN_RECORDS = DRIVER_APPEND_MAX_ROWS  # held in the driver while a table's record size is unknown
RECORD_OVERHEAD_BYTES = 128  # a change row's own columns: positions, op, times, the key's JSON
ESTIMATE_TTL_S = 600.0  # current's row size read again after this (its columns and values change)
DEAD = "__dead_letter"  # the kind of a record that could not be decoded

T = TypeVar("T")
log = logging.getLogger(__name__)
_sizes_lock = threading.Lock()
_estimated: dict[str, tuple[float, CurrentEstimate]] = {}  # current's path -> (when read, estimate)
_held: dict[str, float] = {}  # current's path -> bytes per record of the table's last batch held in the driver
_too_big: dict[str, float] = {}  # current's path -> when a batch of the table did not fit in the driver
_refused: dict[str, int] = {}  # current's path -> how many times the driver could not take a batch's collect
# what Spark says when a job's results exceed spark.driver.maxResultSize ("Total size of serialized
# results of 1 tasks (16.2 MiB) is bigger than spark.driver.maxResultSize (4.0 MiB)")
_RESULT_TOO_BIG = ("spark.driver.maxResultSize", "Total size of serialized results")
_RESULT_TOO_BIG_SENTENCE = re.compile(r"Total size of serialized results .*?maxResultSize \([^)]*\)")


def fits_in_driver(window: WindowPlan, table: LakeTable) -> bool:
    """Whether a stream batch (not a window: those can be a day's records) is held in the
    driver: its records (its offsets bound them; compaction only removes some) times their
    estimated size within ``lake.driver_batch_max_mb``. A batch above
    ``DRIVER_BATCH_MIN_RECORDS`` also needs everything after the decode to stay in the
    driver (current, and history if kept, within the driver merge's bound): a Spark MERGE would take
    the held rows back into the JVM as a local relation instead of a cached frame."""
    from cdc_platform.model.windows import is_batch_key

    if not is_batch_key(window.key) or not _driver_takes_batches(table):
        return False
    records = sum(r.end - r.start for r in window.ranges)
    estimate = current_estimate(table)
    if estimate.record_bytes is None:
        return records <= DRIVER_BATCH_MIN_RECORDS
    if records * estimate.record_bytes > table.driver_batch_max_bytes:
        return False
    return records <= DRIVER_BATCH_MIN_RECORDS or _merged_in_driver(table, records, estimate)


def _merged_in_driver(table: LakeTable, records: int, estimate: CurrentEstimate) -> bool:
    """Whether a batch of ``records`` is expected to merge by delta-rs: into current
    (``driver_merge``'s bounds) and, for a table with history, into history too
    (``driver_history``: the same bound on its versions)."""
    bound = driver_merge_bound(table)
    small = estimate.rows is not None and estimate.rows <= bound and records <= DRIVER_MERGE_MAX_CHANGES
    if not table.config.history:
        return small
    return small and estimate.history_rows is not None and estimate.history_rows <= bound


def collects_in_driver(table: LakeTable, rows: int) -> bool:
    """Whether the driver may collect ``rows`` rows of a batch it does not hold (a driver
    merge's latest event per key): their estimated bytes within ``lake.driver_batch_max_mb``.
    Without an estimate yet (no current file) the merge's own bounds decide, as before."""
    if not _driver_takes_batches(table):
        return False
    record_bytes = current_estimate(table).record_bytes
    return record_bytes is None or rows * record_bytes <= table.driver_batch_max_bytes


def _driver_takes_batches(table: LakeTable) -> bool:
    """Not ``lake.driver_batch_max_mb: 0``, and no batch of the table was too big lately."""
    return table.driver_batch_max_bytes > 0 and not recently_too_big(table)


def within_driver(table: LakeTable, what: str, collect: Callable[[], T]) -> T | None:
    """``collect()`` (what brings ``what`` of a batch of ``table`` into the driver), or None
    when the driver could not take it (``too_big``): the caller goes on through Spark."""
    try:
        return collect()
    except Exception as exc:
        if not too_big_for_driver(exc):
            raise
        too_big(table, what, exc)
        return None


def too_big_for_driver(exc: BaseException) -> bool:
    """Whether ``exc`` says the driver could not take what a batch collected: Spark refused
    the results (``spark.driver.maxResultSize``) or Python ran out of memory. Anything else
    (Kafka unreachable, a bad record) is the batch's error, whichever path reads it."""
    return isinstance(exc, MemoryError) or any(marker in str(exc) for marker in _RESULT_TOO_BIG)


def too_big(table: LakeTable, what: str, exc: BaseException) -> None:
    """``what`` of a batch of ``table`` did not fit in the driver: said once, with the fix,
    and the table's batches go through Spark's jobs and MERGE for ``ESTIMATE_TTL_S``."""
    with _sizes_lock:
        _too_big[table.current_path] = time.monotonic()
        _refused[table.current_path] = _refused.get(table.current_path, 0) + 1
    text = " ".join(str(exc).split())
    said = _RESULT_TOO_BIG_SENTENCE.search(text)
    why = said.group(0) if said else "out of memory" if isinstance(exc, MemoryError) else text[:300]
    log.warning(
        "%s: %s was too big for the driver (%s); this batch and the table's batches for the next %.0f min go "
        "through Spark's jobs and MERGE instead. If the table's changes stay this wide, lower "
        "lake.driver_batch_max_mb or raise spark.driver.maxResultSize and spark.driver.memory",
        table.key, what, why, ESTIMATE_TTL_S / 60,
    )  # fmt: skip


def refused(table: LakeTable) -> int:
    """How many times, in this process, the driver could not take a collect of ``table``'s
    batches (``too_big``): the apply's reports show it, so a table on Spark is seen in the UI."""
    with _sizes_lock:
        return _refused.get(table.current_path, 0)


def recently_too_big(table: LakeTable) -> bool:
    with _sizes_lock:
        since = _too_big.get(table.current_path)
    return since is not None and time.monotonic() - since < ESTIMATE_TTL_S


@dataclass(frozen=True)
class CurrentEstimate:
    record_bytes: float | None  # a decoded change record's bytes in the driver; None: unknown yet
    rows: int | None  # current's rows from its log (an upper bound: rows deletion vectors mark count)
    history_rows: int | None = None  # history's versions, the same way (tables with history)


def current_estimate(table: LakeTable) -> CurrentEstimate:
    """A decoded change record's estimated bytes in the driver (see the module's docstring)
    and current's rows, read from current's log at most every ``ESTIMATE_TTL_S``."""
    now, path = time.monotonic(), table.current_path
    with _sizes_lock:
        cached = _estimated.get(path)
    if cached is None or now - cached[0] >= ESTIMATE_TTL_S:
        row, rows = row_bytes(path)
        versions = table_rows(table.history_path) if table.config.history else None
        cached = (now, CurrentEstimate(None if row is None else 2 * row + RECORD_OVERHEAD_BYTES, rows, versions))
        with _sizes_lock:
            _estimated[path] = cached
    with _sizes_lock:
        held = _held.get(path)
    known = [b for b in (cached[1].record_bytes, held) if b is not None]
    return CurrentEstimate(max(known) if known else None, cached[1].rows, cached[1].history_rows)


def remember_held(table: LakeTable, records: pa.Table) -> None:
    """What a batch held in the driver took per record: a floor for the table's next estimates
    (the Parquet estimate is low for values Parquet stores in a dictionary)."""
    if records.num_rows:
        with _sizes_lock:
            _held[table.current_path] = records.nbytes / records.num_rows


def table_rows(path: str) -> int | None:
    """The Delta table's rows from its log's statistics (delta-rs' ``count``, what the driver
    history's bound reads); None: no table."""
    from deltalake import DeltaTable

    try:
        if not DeltaTable.is_deltatable(path):
            return None
        return int(DeltaTable(path).count())
    except Exception as exc:  # a store this process cannot reach: no estimate, Spark's jobs
        log.debug("no row count for %s: %s", path, exc)
        return None


def row_bytes(path: str) -> tuple[float | None, int | None]:
    """Uncompressed bytes per row of the Delta table's largest file (its Parquet footer), and
    the table's rows; None for what is not known (no table, no file, a file this process
    cannot open: the batch bound falls back to a record count)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    rows: int | None = None
    try:
        if not DeltaTable.is_deltatable(path):
            return None, None
        files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
        # at least current's rows: rows deletion vectors mark are counted too, which only sends
        # a batch to Spark's jobs sooner
        rows = int(pc.sum(files["num_records"]).as_py() or 0)
        if files.num_rows == 0:
            return None, rows
        largest = pc.index(files["num_records"], pc.max(files["num_records"])).as_py()
        footer = pq.read_metadata(pyarrow_uri(f"{path.rstrip('/')}/{unquote(files['path'][largest].as_py())}"))
    except Exception as exc:  # a store this process cannot reach, a file VACUUMed meanwhile: no estimate
        log.debug("no row size for %s: %s", path, exc)
        return None, rows
    if footer.num_rows == 0:
        return None, rows
    total: int = sum(footer.row_group(g).total_byte_size for g in range(footer.num_row_groups))
    footer_rows: int = footer.num_rows
    return total / footer_rows, rows


def collected_records(rows: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> tuple[pa.Table, int]:
    """``jvm_decoded`` rows collected (the batch's one Spark job), with the records Spark SQL
    left to the Python decoder decoded here: change rows (``change_schema_of(schema)``),
    and how many records the Python decoder took."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_schema

    from cdc_platform.lake.jvm_decode import change_schema_of
    from cdc_platform.lake.kafka_source import decode_mixed_batches

    collected = rows.toArrow()
    out = change_schema_of(schema)
    arrow_schema = to_arrow_schema(out, timezone="UTC")
    if collected.num_rows == 0:  # Arrow's kernels refuse columns without chunks
        return arrow_schema.empty_table(), 0
    in_jvm = pc.sum(pc.fill_null(collected["__jvm"], False).cast(pa.int64())).as_py() or 0
    decoded = decode_mixed_batches(iter(collected.to_batches()), schema.to_json(), encoding.to_option(), out.json())
    return pa.Table.from_batches(list(decoded), schema=arrow_schema), collected.num_rows - in_jvm


def kind_statistics(records: pa.Table) -> list[dict[str, Any]]:
    """Per kind of record (its op, "tombstone", or ``DEAD``) what ``changelog._decoded``'s
    Spark aggregation gives: ``n``, ``lo``/``hi`` (commit LSNs), ``ts``/``ts_lo`` (source
    times), ``t`` (the newest truncate's position) and ``unknown`` (columns the schema lacks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if records.num_rows == 0:  # Arrow's kernels refuse columns without chunks
        return []
    op = records["op"]
    kind = pc.if_else(
        pc.is_valid(records["error"]), pa.scalar(DEAD), pc.if_else(pc.is_null(op), pa.scalar("tombstone"), op)
    )
    kinds = []
    for name in pc.unique(kind).to_pylist():
        part = records.filter(pc.equal(kind, name))
        commits, times = pc.min_max(part["commit_lsn"]), pc.min_max(part["source_ts"])
        unknown = pc.unique(pc.list_flatten(part["unknown_columns"])).drop_null().to_pylist()
        kinds.append(
            {
                "kind": name, "n": part.num_rows, "lo": commits["min"].as_py(), "hi": commits["max"].as_py(),
                "ts": times["max"].as_py(), "ts_lo": times["min"].as_py(), "t": _newest_truncate(part),
                "unknown": unknown,
            }
        )  # fmt: skip
    return kinds


def _newest_truncate(part: pa.Table) -> dict[str, int] | None:
    """The greatest (commit LSN, LSN) among the truncates of ``part``, as Spark's ``max`` of
    the pair orders it (a null sorts first)."""
    import pyarrow.compute as pc

    truncates = part.filter(pc.equal(part["op"], "t"))
    if truncates.num_rows == 0:
        return None
    order = pc.sort_indices(truncates, [("commit_lsn", "ascending", "at_start"), ("lsn", "ascending", "at_start")])
    newest = truncates.take(order.slice(len(order) - 1))
    return {"commit_lsn": newest["commit_lsn"][0].as_py(), "lsn": newest["lsn"][0].as_py()}
