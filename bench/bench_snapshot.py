"""Snapshot generations of one big table against ``COPY … TO STDOUT``, measured in one run.

* rows/s of a generation into Delta, ``snapshot.mode: exported`` (every chunk in one
  exported MVCC snapshot) and ``incremental`` (each chunk in its own transaction, waves
  of chunks committed and recorded), against ``COPY (SELECT …) TO STDOUT`` of the same
  table read to nowhere (the floor);
* the longest-open transaction of the platform's backends on the source while each
  generation reads (``pg_stat_activity.xact_start`` of the backends holding an xmin,
  sampled every 100 ms): what holds vacuum back;
* resuming an incremental generation interrupted once half of its chunks are recorded
  (here by an exception in the run, in-process; a SIGKILLed process resumes the same
  way, ``spark/test_snapshot.py``), against the whole generation.

The table is ``bench_lake.py``'s (bigint key, numeric, text, timestamptz, jsonb) in the
dev stack's shop database.

Run: make bench   (or .venv/bin/python bench/bench_snapshot.py [--rows 10000000 --chunk-rows 100000])
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

import bench_lake
import psycopg

from cdc_platform.config import PlatformConfig
from cdc_platform.config.model import PostgresSource, SnapshotConfig, SnapshotMode
from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.snapshot import GenerationRequest, take_generation
from cdc_platform.model.errors import CdcError


class Interrupted(Exception):
    """Stands in for a killed run once half of the chunks are recorded."""


class LongestTransaction(threading.Thread):
    """The longest-open transaction (seconds) of the platform's backends holding an xmin."""

    def __init__(self, config: PlatformConfig) -> None:
        super().__init__(daemon=True)
        shop = config.sources["shop"]
        assert isinstance(shop, PostgresSource)
        self.conninfo = shop.conninfo("shop", "bench_watch")
        self.longest_s = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self._halt.wait(0.1):
                row = conn.execute(
                    "SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'cdc_platform%' AND backend_xmin IS NOT NULL "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()
                self.longest_s = max(self.longest_s, float(row[0]) if row else 0.0)

    def __enter__(self) -> LongestTransaction:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._halt.set()
        self.join()


def with_mode(config: PlatformConfig, mode: SnapshotMode, chunk_rows: int) -> PlatformConfig:
    table = config.tables[0].model_copy(update={"snapshot": SnapshotConfig(mode=mode, chunk_rows=chunk_rows)})
    return config.model_copy(update={"tables": [table]})


def generation(lake: Lake, name: str) -> tuple[float, float, int, int]:
    """Seconds, the longest transaction's age, rows and chunks of one generation."""
    key = lake.config.tables[0].key
    with LongestTransaction(lake.config) as watch:
        started = time.perf_counter()
        result = lake.snapshot(key, name)
        elapsed = time.perf_counter() - started
    return elapsed, watch.longest_s, result.rows, result.spark_partitions


def interrupted_then_resumed(lake: Lake, name: str) -> tuple[float, float, float]:
    """Seconds until the interruption (at the first wave that completes half of the
    chunks), the share of chunks recorded then, and the seconds of the resume."""
    key = lake.config.tables[0].key
    table, source = lake.table(key), lake.source(key)
    share = [0.0]

    def stop_at_half(line: str) -> None:
        if " chunks (" in line:
            done, total = line.rsplit(": ", maxsplit=1)[-1].split(" chunks", maxsplit=1)[0].split("/")
            if int(done) * 2 >= int(total):
                share[0] = int(done) / int(total)
                raise Interrupted(line)

    started = time.perf_counter()
    try:
        take_generation(lake.spark, lake.ledger, source, lake.kafka, table, GenerationRequest(name), stop_at_half)
    except CdcError as exc:  # the run classifies what ended it; ours is the stand-in for a kill
        if not isinstance(exc.__cause__, Interrupted):
            raise
    else:
        raise AssertionError("the generation finished before half of its chunks were recorded")
    until_interrupt = time.perf_counter() - started
    started = time.perf_counter()
    take_generation(lake.spark, lake.ledger, source, lake.kafka, table, GenerationRequest(name))
    return until_interrupt, share[0], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = bench_lake.prepare(args.rows, tag)
    spark = get_spark_session(config.spark.model_copy(update={"master": "local[*]"}))
    exported = Lake(with_mode(config, SnapshotMode.EXPORTED, args.chunk_rows), spark)
    incremental = Lake(with_mode(config, SnapshotMode.INCREMENTAL, args.chunk_rows), spark)
    m: dict[str, float] = {}
    try:
        incremental.snapshot(config.tables[0].key, "warmup")  # JVM, JDBC and Delta paths warm
        m["copy_bytes"], m["copy_s"] = bench_lake.copy_floor(config)
        m["exported_s"], m["exported_xact_s"], m["rows"], _ = generation(exported, "exported")
        m["incremental_s"], m["incremental_xact_s"], _, chunks = generation(incremental, "incremental")
        m["chunks"] = chunks
        m["until_interrupt_s"], m["interrupted_share"], m["resume_s"] = interrupted_then_resumed(incremental, "resumed")
    finally:
        bench_lake.cleanup(config, tag)
    report(m)


def report(m: dict[str, float]) -> None:
    rows, copy_rate = m["rows"], m["rows"] / m["copy_s"]
    print(f"\nsnapshot of {rows:.0f} rows, {m['chunks']:.0f} chunks (floor = COPY TO STDOUT of the same table)")
    print(f"  COPY {m['copy_s']:7.2f} s ({copy_rate:9.0f} rows/s, {m['copy_bytes'] / 1e6:.0f} MB)")
    for mode in ("exported", "incremental"):
        seconds = m[f"{mode}_s"]
        print(
            f"  {mode:11s} {seconds:7.2f} s ({rows / seconds:9.0f} rows/s)   ratio {mode}/floor = "
            f"{m['copy_s'] / seconds:.3f}   longest open transaction {m[f'{mode}_xact_s']:.2f} s"
        )
    print(
        f"  incremental interrupted at {m['interrupted_share']:.0%} of its chunks "
        f"after {m['until_interrupt_s']:.2f} s, resumed in {m['resume_s']:.2f} s "
        f"(resume/whole generation = {m['resume_s'] / m['incremental_s']:.2f})"
    )


if __name__ == "__main__":
    main()
