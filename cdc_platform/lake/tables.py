"""A configured table as the lake sees it: where its Delta tables live, its topic, its
settings. Resolved once from the config; lake code takes this, never the whole config.

Layout under ``<lake>/<source>/<table>/``: ``snapshot/<generation>``, ``changelog``
(partitioned by window), ``dead_letters``, ``current``, ``current_deletes`` (positions of
deleted keys, so a late duplicate never resurrects a row) and ``history``. Pipeline
state is in ``<lake>/_ledger`` (``lake/ledger.py``).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_platform.config.model import PlatformConfig, TableConfig
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.model.leases import apply_scope

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

# characters Parquet (and Delta without column mapping) refuse in a column name
PARQUET_UNSAFE_NAME = re.compile(r"[ ,;{}()\n\t=]")


@dataclass(frozen=True)
class LakeTable:
    config: TableConfig
    lake_root: str
    topic: str
    encoding: ValueEncoding  # how the topic's producer writes values (Debezium's representation settings)
    deletion_vectors: bool = True  # current's MERGEs mark rows instead of rewriting files (lake.deletion_vectors)
    decoder: str = "auto"  # the source's apply.decoder: jvm, python or auto
    driver_merge_max_rows: int | None = None  # lake.driver_merge_max_rows; None: driver_merge's default
    retain_old_files_hours: int = 24  # lake.retain_old_files_hours
    vacuum_every_s: float | None = 3600.0  # lake.vacuum_every_minutes; None: never
    driver_batch_max_bytes: int = 128 * 2**20  # lake.driver_batch_max_mb; 0: Spark's jobs for every batch

    @property
    def retention(self) -> dict[str, str]:
        """The Delta property that keeps replaced files ``retain_old_files_hours`` (what Spark's
        and delta-rs' VACUUM read when not told a retention)."""
        return {"delta.deletedFileRetentionDuration": f"interval {self.retain_old_files_hours} hours"}

    @property
    def root(self) -> str:
        """``<lake>/<source>/<table>``."""
        return f"{self.lake_root.rstrip('/')}/{self.config.source}/{self.config.dagster_name}"

    @property
    def key(self) -> str:
        return self.config.key

    @property
    def source(self) -> str:
        return self.config.source

    @property
    def apply_scope(self) -> str:
        """The lease a stream apply holds to apply this table (``model.leases``)."""
        return apply_scope(self.config.source, self.config.apply_group)

    def snapshot_path(self, generation: str) -> str:
        return f"{self.root}/snapshot/{generation}"

    @property
    def changelog_path(self) -> str:
        return f"{self.root}/changelog"

    @property
    def dead_letters_path(self) -> str:
        return f"{self.root}/dead_letters"

    @property
    def current_path(self) -> str:
        return f"{self.root}/current"

    @property
    def deletes_path(self) -> str:
        return f"{self.root}/current_deletes"

    @property
    def history_path(self) -> str:
        return f"{self.root}/history"


def lake_table(config: PlatformConfig, table: TableConfig) -> LakeTable:
    source = config.sources[table.source]
    return LakeTable(
        table, config.lake.root, config.topic_for(table), source.value_encoding(), config.lake.deletion_vectors,
        source.apply.decoder, config.lake.driver_merge_max_rows, config.lake.retain_old_files_hours,
        None if config.lake.vacuum_every_minutes is None else config.lake.vacuum_every_minutes * 60,
        config.lake.driver_batch_max_mb * 2**20,
    )  # fmt: skip


def lake_tables(config: PlatformConfig) -> list[LakeTable]:
    return [lake_table(config, t) for t in config.tables]


STATISTICS_LEAVES = 32  # Delta's default dataSkippingNumIndexedCols


def table_options(
    schema: DataType, partition_by: tuple[str, ...] = (), statistics_on: tuple[str, ...] | None = None
) -> dict[str, str]:
    """Delta table properties for a new table of this shape, as writer options. Column
    mapping (by name) only when a column name, at any depth, has a character Parquet
    refuses ("Order Id"): it needs reader features that delta-rs' and DuckDB's plain
    readers lack, so every other table goes without. A table keeps what it was created
    with. ``statistics_on``: the only top-level columns with file statistics (a snapshot
    table is read whole, never pruned: statistics on its other columns are write time
    spent for nothing)."""
    unsafe = any(PARQUET_UNSAFE_NAME.search(name) for name in _field_names(schema))
    mapping = {"delta.columnMapping.mode": "name"} if unsafe else {}
    if statistics_on is not None:
        return {**mapping, **_statistics_only_on(schema, statistics_on)}
    return {**mapping, **_statistics_options(schema, partition_by)}


def _statistics_only_on(schema: DataType, columns: tuple[str, ...]) -> dict[str, str]:
    """Statistics on ``columns`` alone (dates and types Delta keeps no min/max for left out)."""
    wanted, eligible = {quote_spark(c) for c in columns}, _statistics_types()
    indexed = [path for path, kind in _leaves(schema) if path in wanted and isinstance(kind, eligible)]
    if not indexed:
        return {"delta.dataSkippingNumIndexedCols": "0"}
    return {"delta.dataSkippingStatsColumns": ",".join(indexed)}


def _statistics_types() -> tuple[type, ...]:
    """The types Delta keeps min/max for (naming another is an error), dates left out."""
    from pyspark.sql import types as T

    return (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType,
            T.StringType, T.TimestampType, T.TimestampNTZType)  # fmt: skip


def quote_spark(name: str) -> str:
    """A column name as Spark SQL quotes it (backticks, a backtick doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _statistics_options(schema: DataType, partition_by: tuple[str, ...]) -> dict[str, str]:
    """File statistics for every column but dates, on tables that have a date column.

    A date before year 1 or after 9999 (PostgreSQL has them, and ±infinity) in a file's
    min/max makes delta-rs' ``to_pyarrow_table()`` fail for the whole table (its Python
    layer parses the statistic with ``date.fromisoformat``; past ±262 000 years its core
    panics). One edge value must not lock a family of readers out, so date columns are
    not indexed; every other column is, as many as Delta's default (32 leaves), except
    partition columns (Delta refuses statistics on them; their values are in the paths)."""
    from pyspark.sql import types as T

    leaves = list(_leaves(schema))
    if not any(isinstance(kind, T.DateType) for _, kind in leaves):
        return {}
    partitions, eligible = {quote_spark(name) for name in partition_by}, _statistics_types()
    indexed = [path for path, kind in leaves if isinstance(kind, eligible) and path not in partitions]
    indexed = indexed[:STATISTICS_LEAVES]
    if not indexed:
        return {"delta.dataSkippingNumIndexedCols": "0"}
    return {"delta.dataSkippingStatsColumns": ",".join(indexed)}


def _leaves(data_type: DataType, prefix: str = "") -> Iterator[tuple[str, DataType]]:
    """(quoted dotted path, type) of each non-struct field, structs walked (Delta keeps no
    statistics inside arrays and maps)."""
    from pyspark.sql.types import StructType

    assert isinstance(data_type, StructType)
    for field in data_type.fields:
        path = prefix + quote_spark(field.name)
        if isinstance(field.dataType, StructType):
            yield from _leaves(field.dataType, path + ".")
        else:
            yield path, field.dataType


def _field_names(data_type: DataType) -> Iterator[str]:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        for field in data_type.fields:
            yield field.name
            yield from _field_names(field.dataType)
    elif isinstance(data_type, ArrayType):
        yield from _field_names(data_type.elementType)
    elif isinstance(data_type, MapType):
        yield from _field_names(data_type.keyType)
        yield from _field_names(data_type.valueType)


DICTIONARY_SETTING = "parquet.enable.dictionary#{}"  # Parquet's own per-column switch
_DICTIONARY_LOCK = threading.Lock()
_DICTIONARY_OFF: weakref.WeakKeyDictionary[SparkSession, dict[str, int]] = weakref.WeakKeyDictionary()


@contextmanager
def parquet_dictionary_off(spark: SparkSession, columns: Iterable[str]) -> Iterator[tuple[str, ...]]:
    """Parquet files written in the block try no dictionary for ``columns`` (top-level
    columns the source holds nearly unique). Parquet's writer builds a dictionary of each
    column's values until the page ends and then drops it if it saves nothing: for a unique
    column that is every value hashed for nothing. A 10M-row generation of the bench table
    (four unique columns of five) took 16.8-20.6 s with them off against 18.4-22.7 s
    (docs/benchmarks.md, "Stop 78"); the files are the same size, as Parquet fell back to
    plain values anyway. Delta passes no writer option to Parquet, so this is the session's
    setting, set while any block of the session needs it (another thread's same-named
    column loses its dictionary meanwhile: bigger files, the same values). A column the
    user set in ``spark.conf`` keeps the user's setting. Yields the columns switched."""
    keys = [DICTIONARY_SETTING.format(c) for c in dict.fromkeys(columns) if not set(c) & {".", "#"}]
    taken = []
    with _DICTIONARY_LOCK:
        held = _DICTIONARY_OFF.setdefault(spark, {})
        for key in keys:
            if key not in held:
                if spark.conf.get(key, None) is not None:
                    continue  # the user's
                spark.conf.set(key, "false")
            held[key] = held.get(key, 0) + 1
            taken.append(key)
    try:
        yield tuple(k.split("#", 1)[1] for k in taken)
    finally:
        with _DICTIONARY_LOCK:
            for key in taken:
                held[key] -= 1
                if not held[key]:
                    del held[key]
                    spark.conf.unset(key)
