"""A table with history: what a small stream batch costs, and whether it grows with history.

One synthetic table of 100k rows is built as the platform builds it (a committed
generation, current and history rebuilt from it). Then batches of 20 random updates are
merged the way ``cdc-platform apply`` merges a micro-batch (``apply_decoded``: current and
history at once), three ways in one driver:

* **floor**: the same table without history (current's MERGE alone);
* **history**: with history (100k open versions), a history this small sequenced in the
  driver and merged by delta-rs (``lake.driver_history``);
* **history through Spark**: the same, with the driver path switched off (Spark's apply,
  what every history took before, and what a history above ``lake.driver_merge_max_rows`` takes);
* **long history**: the same, after its history gained ``--closed`` closed versions
  (older versions of every key, as years of updates leave them); above the driver's
  bound at the default sizes, so Spark's.

Prints the median batch of each, each history against the floor, and long history against
history through Spark (the cost should follow the batch, not history's length).

Run: .venv/bin/python bench/bench_history.py [--rows 100000] [--closed 2000000] [--batches 12]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_merge import WATERMARK, commit_generation, make_config

from cdc_platform.config.model import SparkConfig
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.lake import current
from cdc_platform.lake.current import apply_current, apply_decoded, summarize
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.tables import LakeTable, lake_table

BATCH = 20
in_driver = current.apply_history_in_driver


def build_table(spark: Any, root: Path, rows: int, history: bool) -> tuple[LakeTable, Ledger]:
    """Current (and history) of ``rows`` rows, rebuilt from a committed generation."""
    config = make_config(root, history)
    table, ledger = lake_table(config, config.tables[0]), Ledger(config.lake.root)
    commit_generation(spark, table, ledger, rows)
    apply_current(spark, ledger, table)
    return table, ledger


def add_closed_versions(spark: Any, table: LakeTable, rows: int, closed: int) -> None:
    """Older, closed versions of every key, positioned before the generation's watermark."""
    from pyspark.sql import functions as F

    per_key = max(closed // rows, 1)
    at = F.to_timestamp(F.lit("2026-01-01 00:00:00"))
    n = F.floor(F.col("id") / rows).cast("long")
    start, end = n * 2 + 1, n * 2 + 3  # each version ends where the key's next one starts
    spark.range(rows * per_key).select(
        (F.col("id") % rows).alias("id"), n.alias("v"), F.lit("old").alias("s"), at.alias("valid_from"),
        at.alias("valid_to"), F.lit(False).alias("is_current"), F.lit("u").alias("_cdc_op"),
        start.alias("_cdc_commit_lsn"), start.alias("_cdc_lsn"), end.alias("_cdc_end_commit_lsn"),
        end.alias("_cdc_end_lsn"),
    ).write.format("delta").mode("append").save(table.history_path)  # fmt: skip


def batch_of_updates(spark: Any, rows: int, number: int) -> Any:
    """``BATCH`` updates of random keys, decoded as the stream apply holds a micro-batch."""
    from pyspark.sql import functions as F

    first = WATERMARK + 1 + number * BATCH
    row = "struct<id:bigint,v:bigint,s:string>"
    events = spark.range(BATCH).select(
        F.lit(0).alias("kafka_partition"),
        (F.lit(number * BATCH) + F.col("id")).alias("kafka_offset"),
        F.current_timestamp().alias("kafka_timestamp"),
        F.lit("u").alias("op"),
        F.lit(False).alias("is_tombstone"),
        (F.lit(first) + F.col("id")).alias("commit_lsn"),
        (F.lit(first) + F.col("id")).alias("lsn"),
        (F.lit(first) + F.col("id")).alias("tx_id"),
        F.current_timestamp().alias("source_ts"),
        F.lit(None).cast("string").alias("key_json"),
        F.lit(None).cast(row).alias("before"),
        F.struct(
            (F.abs(F.xxhash64(F.col("id"), F.lit(number))) % rows).alias("id"),
            F.lit(number).cast("long").alias("v"),
            F.lit("changed").alias("s"),
        ).alias("after"),
        F.array().cast("array<string>").alias("unavailable"),
    )
    return events.cache()


def time_batches(spark: Any, table: LakeTable, ledger: Ledger, rows: int, batches: int) -> list[float]:
    """Seconds of each batch's ``apply_decoded`` (current and, when kept, history)."""
    generation = ledger.committed(table.key)
    assert generation is not None
    times = []
    for number in range(batches):
        events = batch_of_updates(spark, rows, number)
        events.count()  # the stream apply holds its decoded batch in memory
        position = ledger.current(table.key)
        assert position is not None
        started = time.perf_counter()
        result = apply_decoded(
            spark, ledger, table, generation, position, events, summarize(events), {0: (number + 1) * BATCH}
        )
        times.append(time.perf_counter() - started)
        assert result.changes_applied == BATCH, result
        if table.config.history:
            assert result.history is not None and result.history.versions_opened == BATCH, result.history
        events.unpersist()
        print(f"  batch {number:>2}: {times[-1]:.2f} s", flush=True)
    return times


def settled(times: list[float]) -> float:
    """The median once JIT and Delta's code paths are warm (the first third dropped)."""
    return statistics.median(times[len(times) // 3 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--closed", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    # local[2]: the demo's apply (and CI) has two cores
    spark = get_spark_session(SparkConfig(master="local[2]", jars_dir=str(REPO_ROOT / ".cdc" / "jars" / "spark")))
    medians = {}
    with tempfile.TemporaryDirectory(prefix="bench_history_") as tmp:
        print("warm-up (JIT and Delta's code paths):", flush=True)
        warm, warm_ledger = build_table(spark, Path(tmp) / "warmup", 1000, True)
        time_batches(spark, warm, warm_ledger, 1000, 6)
        for n, (name, history, closed, driver) in enumerate((
            ("floor (no history)", False, 0, True),
            ("history (in the driver)", True, 0, True),
            ("history through Spark", True, 0, False),
            (f"long history (+{args.closed} closed versions)", True, args.closed, True),
        )):  # fmt: skip
            print(f"{name}:", flush=True)
            table, ledger = build_table(spark, Path(tmp) / str(n), args.rows, history)
            if closed:
                add_closed_versions(spark, table, args.rows, closed)
            # the driver path off: as if delta-rs had refused the table (its fallback)
            current.apply_history_in_driver = in_driver if driver else (lambda *_: None)
            medians[name] = settled(time_batches(spark, table, ledger, args.rows, args.batches))
            current.apply_history_in_driver = in_driver
    floor, short, by_spark, long = medians.values()
    print(f"\n{BATCH}-change batches into {args.rows} rows, median after warm-up (same run):")
    for name, seconds in medians.items():
        print(f"  {name:<48} {seconds:6.2f} s a batch")
    print(
        f"history in the driver / floor {short / floor:.2f}; history through Spark / floor {by_spark / floor:.2f}; "
        f"long history / history through Spark {long / by_spark:.2f}"
    )


if __name__ == "__main__":
    main()
