"""A small stream batch decoded into the driver: one Spark job instead of three.

A micro-batch of up to ``DRIVER_BATCH_MAX_RECORDS`` records is read from Kafka and decoded
by Spark SQL (``lake.jvm_decode``) in one Spark job whose rows are collected to Arrow. The
records Spark SQL cannot decode exactly go through the same Python decoder here, in the
driver, and the batch's statistics (counts by kind, positions, times, the newest truncate,
columns the schema lacks) are taken from the Arrow table. delta-rs then appends the same
table to the changelog and merges its latest event per key into current
(``lake.driver_append``, ``lake.driver_merge.latest_in_driver``).

Before, each such batch cached the decoded rows and ran three Spark jobs on them: the
statistics, a collect for the changelog append, and an aggregation (with a shuffle) and
a collect for the merge, 0.3-0.4 s each on two cores whatever the batch's size
(docs/benchmarks.md, "Latency"). A Spark frame of the same rows (``createDataFrame`` from
the Arrow table: Kafka is not read again) is still there for what Spark writes: a table's
first append, a schema change, dead letters, history, and Spark's MERGE into a big current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdc_platform.lake.driver_append import DRIVER_APPEND_MAX_ROWS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cdc_platform.envelope.encoding import ValueEncoding
    from cdc_platform.model.tables import TableSchema
    from cdc_platform.model.windows import WindowPlan

DRIVER_BATCH_MAX_RECORDS = DRIVER_APPEND_MAX_ROWS  # what the driver appends is what it holds
DEAD = "__dead_letter"  # the kind of a record that could not be decoded


def fits_in_driver(window: WindowPlan) -> bool:
    """Whether a stream batch (not a window: those can be a day's records) is small enough
    to be held in the driver. Its offsets bound its records (compaction only removes some)."""
    from cdc_platform.model.windows import is_batch_key

    return is_batch_key(window.key) and sum(r.end - r.start for r in window.ranges) <= DRIVER_BATCH_MAX_RECORDS


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
