"""A stream batch's changelog append, written in the driver by delta-rs instead of Spark.

Spark's Delta append of a micro-batch costs 0.3-0.9 s on 2 cores whatever its size (a
write job, statistics, the commit and Delta's post-commit hooks): with every table of a
source taking turns on two cores, that fixed cost is a share of every table's freshness.
delta-rs appends the same rows, held in the driver (``lake.driver_batch``) or collected to
Arrow (at most ``DRIVER_APPEND_MAX_ROWS``), in ~0.04 s for a micro-batch
(docs/benchmarks.md, "Latency"). The commit carries what Spark's does: the batch's
identity as ``userMetadata`` (what a re-applied batch looks for) and the batch as the
table's ``txnAppId``/``txnVersion``.

Spark still appends:
- a table's first batch: the table's properties (column mapping, statistics) are set when
  it is created;
- a batch whose columns are not the table's, in name and order at every depth: a schema
  change, which Spark's ``mergeSchema`` evolves;
- a re-applied batch (its append may have committed: Spark's idempotent write checks);
- every ``autoCompact.minNumFiles``-th batch of a table: Spark's auto compaction runs after
  Spark's own commits only, and then finds the small files of the day that delta-rs wrote,
  so they never pile up between a day's sealings;
- tables with Delta features delta-rs does not write, and a table delta-rs refused once
  (``driver_merge.refuse``: one warning, Spark from then on; nothing was committed, since
  delta-rs commits last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.checksums import drop_stale_checkpoint_checksum
from cdc_platform.lake.driver_merge import (
    arrow_schema_of,
    delta_rs_writes,
    driver_writes,
    refuse,
)
from cdc_platform.lake.tables import LakeTable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

DRIVER_APPEND_MAX_ROWS = 10_000  # whole change rows collected to the driver: a micro-batch, not a backlog
MIN_FILES_CONF = "spark.databricks.delta.autoCompact.minNumFiles"
MIN_FILES_DEFAULT = 50  # Delta's


def spark_appends(
    spark: SparkSession, table: LakeTable, number: int, retry: bool, rows: int, held: bool = False
) -> bool:
    """Whether batch ``number`` (of ``rows`` rows, ``retry``: re-applied) is Spark's to append.
    ``held``: its rows are in the driver already (``lake.driver_batch``), so any number of them
    is appended from there; otherwise up to ``DRIVER_APPEND_MAX_ROWS`` are collected for it."""
    if retry or (rows > DRIVER_APPEND_MAX_ROWS and not held) or not driver_writes(table.changelog_path):
        return True
    every = int(spark.conf.get(MIN_FILES_CONF, str(MIN_FILES_DEFAULT)) or MIN_FILES_DEFAULT)
    return number % max(1, every) == 0


def append_in_driver(table: LakeTable, rows: Callable[[], pa.Table], identity: str, app_id: str, number: int) -> bool:
    """The batch's ``rows`` (collected when called) appended to the changelog by delta-rs,
    with the batch's identity and transaction in the commit. False when Spark must append
    them (see the module's docstring)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    try:
        target = DeltaTable(table.changelog_path)
    except TableNotFoundError:
        return False  # the first batch creates the table, with its properties: Spark's
    if not delta_rs_writes(target, table.key, table.changelog_path, "changelog appended"):
        return False
    schema = arrow_schema_of(target)
    data = rows()
    if _shape(data.schema) != _shape(schema):
        return False  # a schema change: Spark's mergeSchema evolves the table
    try:
        write_deltalake(
            target, data.cast(schema), mode="append", partition_by=list(target.metadata().partition_columns),
            commit_properties=CommitProperties(
                custom_metadata={"userMetadata": identity}, app_transactions=[Transaction(app_id, number)]
            ),
        )  # fmt: skip
    except Exception as exc:  # nothing committed (the commit is delta-rs' last step): Spark appends
        refuse(table.key, table.changelog_path, "changelog appended", f"{type(exc).__name__}: {exc}")
        return False
    drop_stale_checkpoint_checksum(table.changelog_path)
    return True


def _shape(schema: pa.Schema) -> tuple[Any, ...]:
    """Column names and types at every depth, in order, up to how Arrow spells the same
    Delta type (text as string or string_view, an instant's zone name): what must match for
    the cast to the table's schema to change no value."""
    return tuple((f.name, _type_shape(f.type)) for f in schema)


def _type_shape(kind: pa.DataType) -> Any:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return tuple((kind.field(i).name, _type_shape(kind.field(i).type)) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return ("list", _type_shape(kind.value_type))
    if pa.types.is_map(kind):
        return ("map", _type_shape(kind.key_type), _type_shape(kind.item_type))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return "binary"
    if pa.types.is_timestamp(kind):  # Delta's timestamp is UTC whatever zone Arrow names
        return ("timestamp", kind.unit, kind.tz is not None)
    return str(kind)
