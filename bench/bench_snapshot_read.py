"""Three ways for Spark's tasks to fetch a generation's chunks, against ``COPY … TO STDOUT``.

Issue 17 asks for a faster read than Spark JDBC if JDBC cannot reach half of COPY's rate:
``COPY … (FORMAT binary)`` into Arrow inside the Spark tasks, or an ADBC driver. This
measures both candidates in one run, on the same chunk plan (an incremental generation's
key-range chunks, the same column expressions):

* ``jdbc``: the platform's read (``lake/snapshot.read_jdbc``: Spark's JDBC source, pgjdbc);
* ``adbc``: a Spark Python data source (defined here) whose tasks run each chunk's query
  through ADBC's PostgreSQL driver (libpq, ``COPY (…) TO STDOUT (FORMAT binary)`` decoded
  into Arrow in C++) and hand Spark Arrow batches, converted to lake types by the same
  Spark expressions;
* ``adbc+pyarrow`` (Delta only): the tasks fetch each chunk by ADBC as above and write it
  as Parquet with pyarrow, so no row crosses into the JVM; delta-rs commits the files.
  numeric is read as text (ADBC's own numeric decoding is its costliest column), the
  other conversions are the bench table's, done in Arrow;

each written to ``noop`` (the read alone) and to Delta (as a generation writes it), with
the CPU seconds each kind of process spent (from ``/proc``: PostgreSQL's backends, the
Spark JVM, Python processes; run it on a quiet machine). Two more lines say where a
client's time goes outside Spark: the whole table's query fetched by ADBC in this
process, and COPY's text read by psycopg without parsing, each with this process's CPU.

The table is ``bench_lake.py``'s (bigint key, numeric, text, timestamptz, jsonb) in the
dev stack's shop database.

Run: make bench   (or .venv/bin/python bench/bench_snapshot_read.py [--rows 10000000 --repeat 2])
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import bench_lake
import psycopg
from bench_snapshot import with_mode
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from cdc_platform.config import PlatformConfig
from cdc_platform.config.model import PostgresSource, SnapshotMode
from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.lake_types import lake_type
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.snapshot import as_lake_columns, read_jdbc
from cdc_platform.lake.tables import table_options
from cdc_platform.sources.base import JdbcRead
from cdc_platform.sources.postgres.snapshot import quote_ident

CONNINFO_ENV = "CDC_BENCH_ADBC_CONNINFO"  # the tasks' libpq string, read in the worker: not in Spark's plan


@dataclass
class ChunkQuery(InputPartition):
    sql: str


class AdbcChunks(DataSource):
    """Each partition one chunk's query, fetched by ADBC as Arrow batches."""

    @classmethod
    def name(cls) -> str:
        return "bench_adbc_chunks"

    def reader(self, schema: StructType) -> DataSourceReader:
        return AdbcChunkReader(dict(self.options), schema)


class AdbcChunkReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options, self.schema = options, schema

    def partitions(self) -> Sequence[InputPartition]:
        return [ChunkQuery(sql) for sql in json.loads(self.options["queries"])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import adbc_driver_postgresql.dbapi as adbc
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, ChunkQuery)
        target = to_arrow_schema(self.schema, timezone="UTC")
        with adbc.connect(os.environ[CONNINFO_ENV], autocommit=True) as conn, conn.cursor() as cursor:
            for statement in json.loads(self.options["statements"]):
                cursor.execute(statement)
            cursor.execute(partition.sql)
            for batch in cursor.fetch_record_batch():  # numeric and json come as text in an extension type
                columns = [getattr(c, "storage", c).cast(f.type) for c, f in zip(batch.columns, target, strict=True)]
                yield pa.RecordBatch.from_arrays(columns, schema=target)


def adbc_frame(spark: SparkSession, read: JdbcRead, types: dict[str, Any]) -> DataFrame:
    """The read's chunks through ``AdbcChunks``, as lake columns (the JDBC read's conversions)."""
    from pyspark.sql.types import DecimalType, LongType, StringType, StructField

    statements = [s.strip() for s in read.options["sessionInitStatement"].split(";") if s.strip()]
    select = ", ".join(quote_ident(c.source or c.name) for c in read.columns)
    # the bench table's raw columns as ADBC reads them (numeric as text, the instant as micros)
    raw = {"id": LongType(), "amount": StringType(), "label": StringType(), "at": LongType(), "doc": StringType()}
    assert [c.source or c.name for c in read.columns] == list(raw) and isinstance(types["amount"], DecimalType)
    spark.dataSource.register(AdbcChunks)
    frame = (
        spark.read.format(AdbcChunks.name())
        .schema(StructType([StructField(name, kind) for name, kind in raw.items()]))
        .option("statements", json.dumps(statements))
        .option("queries", json.dumps([f"SELECT {select} FROM {read.source_sql} WHERE {p}" for p in read.predicates]))
        .load()
    )
    return as_lake_columns(frame, read, types)


def write_parquet_in_tasks(
    spark: SparkSession, read: JdbcRead, types: dict[str, Any]
) -> tuple[float, dict[str, float]]:
    """The third path: each Spark task fetches its chunks with ADBC and writes them as
    Parquet with pyarrow, so no row crosses into the JVM (the task returns the file's
    name); delta-rs then commits the files as a Delta table. Seconds and CPU by kind."""
    import deltalake
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructField

    names = [quote_ident(c.source or c.name) for c in read.columns]
    select = ", ".join(
        f"{name}::text" if c.name == "amount" else name for c, name in zip(read.columns, names, strict=True)
    )
    assert [c.source or c.name for c in read.columns] == ["id", "amount", "label", "at", "doc"]
    target = to_arrow_schema(StructType([StructField(c.name, types[c.name]) for c in read.columns]), timezone="UTC")
    out = tempfile.mkdtemp(prefix="bench_read_parquet_")
    chunks = [(f"SELECT {select} FROM {read.source_sql} WHERE {p}", f"{out}/part-{i:05d}.parquet")
              for i, p in enumerate(read.predicates)]  # fmt: skip

    def write_chunks(batches: Iterator[Any]) -> Iterator[Any]:
        import adbc_driver_postgresql.dbapi as adbc
        import pyarrow as pa
        import pyarrow.parquet as pq

        with adbc.connect(os.environ[CONNINFO_ENV], autocommit=True) as conn:
            for batch in batches:
                for sql, path in zip(batch.column("sql").to_pylist(), batch.column("path").to_pylist(), strict=True):
                    with conn.cursor() as cursor:
                        cursor.execute(sql)
                        fetched = cursor.fetch_arrow_table()
                    columns = [column.cast(field.type) for column, field in zip(fetched.columns, target, strict=True)]
                    pq.write_table(pa.table(columns, schema=target), path, write_statistics=["id"])
                    yield pa.RecordBatch.from_pydict({"path": [path], "rows": [fetched.num_rows]})

    frame = spark.createDataFrame(chunks, "sql string, path string").repartition(len(chunks))
    before, started = cpu_by_process(), time.perf_counter()
    written = frame.mapInArrow(write_chunks, "path string, rows long").collect()
    deltalake.convert_to_deltalake(out)
    elapsed, after = time.perf_counter() - started, cpu_by_process()
    assert sum(int(r["rows"]) for r in written) == spark.read.format("delta").load(out).count()
    return elapsed, {kind: round(after[kind] - before[kind], 1) for kind in ("postgres", "java", "python")}


def cpu_by_process() -> Counter[str]:
    """CPU seconds so far of every process by kind, reaped children included (PostgreSQL's
    backends end with their connection and are counted in the postmaster's children)."""
    ticks, out = os.sysconf("SC_CLK_TCK"), Counter[str]()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        kind = next((k for k in ("postgres", "java", "python") if name.startswith(k)), None)
        if kind is not None:
            out[kind] += sum(int(f) for f in fields[11:15]) / ticks
    return out


def timed_write(frame: DataFrame, target: str, key: Sequence[str]) -> tuple[float, dict[str, float]]:
    out = tempfile.mkdtemp(prefix="bench_read_")
    writer = frame.write.format(target).mode("overwrite")
    if target == "delta":
        writer = writer.options(**table_options(frame.schema, statistics_on=tuple(key)))
    before, started = cpu_by_process(), time.perf_counter()
    writer.save(out)
    elapsed, after = time.perf_counter() - started, cpu_by_process()
    return elapsed, {kind: round(after[kind] - before[kind], 1) for kind in ("postgres", "java", "python")}


def client_reads(read: JdbcRead) -> dict[str, tuple[float, float]]:
    """Seconds and this process's CPU seconds: the whole table's query fetched by ADBC, and
    COPY's text of the raw table read by psycopg without parsing it."""
    import adbc_driver_postgresql.dbapi as adbc

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    select = ", ".join(quote_ident(c.source or c.name) for c in read.columns)
    out: dict[str, tuple[float, float]] = {}
    started, cpu0 = time.perf_counter(), cpu()
    with adbc.connect(os.environ[CONNINFO_ENV], autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT {select} FROM {read.source_sql}")
        rows = sum(batch.num_rows for batch in cursor.fetch_record_batch())
    out["adbc fetch, one process"] = (time.perf_counter() - started, cpu() - cpu0)
    assert rows > 0
    started, cpu0 = time.perf_counter(), cpu()
    with (
        psycopg.connect(os.environ[CONNINFO_ENV]) as conn,
        conn.cursor() as cursor,
        cursor.copy(f"COPY {bench_lake.TABLE} TO STDOUT") as copy,
    ):
        for _ in copy:
            pass
    out["psycopg COPY text, unparsed"] = (time.perf_counter() - started, cpu() - cpu0)
    return out


Runs = dict[str, list[tuple[float, dict[str, float]]]]


def measure(
    config: PlatformConfig, frames: dict[str, Callable[[], DataFrame]], key: Sequence[str], repeat: int,
    in_tasks: Callable[[], tuple[float, dict[str, float]]],
) -> tuple[float, Runs]:  # fmt: skip
    """The COPY floor (best of two, one before and one after) and each path's runs."""
    for frame in frames.values():  # warm: the JVM's and the workers' code paths
        frame().limit(1).collect()
    in_tasks()
    copy_s = bench_lake.copy_floor(config)[1]
    results: Runs = {}
    for _ in range(repeat):
        for target in ("noop", "delta"):
            for name, frame in frames.items():
                results.setdefault(f"{name} to {target}", []).append(timed_write(frame(), target, key))
        results.setdefault("adbc+pyarrow to delta", []).append(in_tasks())
    return min(copy_s, bench_lake.copy_floor(config)[1]), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = bench_lake.prepare(args.rows, tag)
    shop = config.sources["shop"]
    assert isinstance(shop, PostgresSource)
    os.environ[CONNINFO_ENV] = shop.conninfo("shop", "cdc_platform_bench_adbc")  # Spark's workers inherit it
    spark = get_spark_session(config.spark.model_copy(update={"master": "local[*]"}))
    lake = Lake(with_mode(config, SnapshotMode.INCREMENTAL, args.chunk_rows), spark)
    key = config.tables[0].key
    table, source = lake.table(key), lake.source(key)
    try:
        with source.snapshot(table.config, lake.kafka, table.topic, False) as plan:
            types = {c.name: lake_type(c.pgtype, c.typmod, c.dims) for c in plan.schema.columns}
            frames = {
                "jdbc": lambda: read_jdbc(spark, plan.read, types),
                "adbc": lambda: adbc_frame(spark, plan.read, types),
            }
            in_tasks = functools.partial(write_parquet_in_tasks, spark, plan.read, types)
            copy_s, results = measure(config, frames, plan.schema.key, args.repeat, in_tasks)
            clients = client_reads(plan.read)
            chunks = len(plan.read.predicates)
    finally:
        bench_lake.cleanup(config, tag)
    report(args.rows, chunks, copy_s, results, clients)


def report(rows: int, chunks: int, copy_s: float, results: Runs, clients: dict[str, tuple[float, float]]) -> None:
    print(f"\nreads of {rows} rows in {chunks} chunks (floor = COPY TO STDOUT of the same table, best of two)")
    print(f"  COPY {copy_s:7.2f} s")
    for path, runs in results.items():
        for seconds, cpu in runs:
            spent = ", ".join(f"{kind} {value:.1f}" for kind, value in cpu.items())
            ratio = f"ratio floor/{path.split()[0]} = {copy_s / seconds:.3f}"
            print(f"  {path:21s} {seconds:7.2f} s   {ratio}   CPU-s: {spent}")
    for path, (seconds, cpu_s) in clients.items():
        print(f"  {path:28s} {seconds:7.2f} s   this process's CPU {cpu_s:.2f} s")


if __name__ == "__main__":
    main()
