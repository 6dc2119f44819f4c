"""Current-state merge: time to apply 10k changes to tables of 100k and of 10M rows.

For each size, a synthetic snapshot generation and a changelog window of 10k changes
(80% updates, 10% deletes, 10% inserts, random keys) are written as the platform writes
them (the generation committed and the window recorded in the ledger). ``apply_current``
builds current twice, O(table) each:

* **first load**: current built from the first generation, a new table. Delta's auto
  compaction runs on the first commit a process makes to a table, and rewrites every file
  under 64 MB: here the whole table, once more;
* **rehydration** (the baseline): current rebuilt in place from a second generation, as a
  new generation does to a running table; the process has compacted it already, so this
  is the write alone.

Then the same 10k changes are merged twice, each time into a fresh copy of that current:

* **stream**: what ``cdc-platform apply`` does, the batch's decoded rows (in memory)
  merged straight into current (``apply_decoded``);
* **window**: what a window run does, read back from the changelog (``apply_current``).

Prints the times, merge/rebuild (against the rehydration), and how the merge time grows
with the table.

Run: make bench   (or .venv/bin/python bench/bench_merge.py [--sizes 100000 10000000])
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from cdc_platform.config.model import PlatformConfig, SparkConfig
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.lake.current import apply_current, apply_decoded, summarize
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.tables import LakeTable, lake_table
from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
from cdc_platform.model.tables import LakeColumn, TableSchema
from cdc_platform.model.windows import WindowPlan, WindowRange

CHANGES = 10_000
WATERMARK = 1000


def make_config(root: Path, history: bool = False, driver_merge_max_rows: int | None = None) -> PlatformConfig:
    return PlatformConfig.model_validate(
        {
            "sources": {"bm": {"database": "bm", "user": "u", "password_env": "UNUSED"}},
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "lake": {"root": str(root), "driver_merge_max_rows": driver_merge_max_rows},
            "tables": [{"name": "bm.public.t", "primary_key": ["id"], "history": history}],
        }
    )


def commit_generation(spark: object, table: LakeTable, ledger: Ledger, size: int) -> None:
    """A synthetic generation of ``size`` rows (id, v, s), committed in the ledger as a
    snapshot commits one (watermark at LSN 1000, before every synthetic change)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)
    spark.range(size).select(
        F.col("id"), (F.col("id") * 2).alias("v"), F.concat(F.lit("row-"), F.col("id").cast("string")).alias("s")
    ).write.format("delta").mode("overwrite").save(table.snapshot_path("g1"))
    int8, text = builtin_type(20), builtin_type(25)
    assert int8 is not None and text is not None
    schema = TableSchema((LakeColumn("id", int8), LakeColumn("v", int8), LakeColumn("s", text)), ("id",))
    committed = GenerationEvent(
        table.key, "g1", GenerationStatus.COMMITTED, watermark=Watermark(WATERMARK, {0: 0}, datetime.now(UTC)),
        schema_json=schema.to_json(),
    )  # fmt: skip
    ledger.record_generation(committed)


def commit_next_generation(table: LakeTable, ledger: Ledger, generation: str) -> None:
    """A later generation with the first one's rows (its snapshot copied byte for byte) and
    watermark position, taken now: the next ``apply_current`` rebuilds current from it."""
    import shutil

    first = ledger.committed(table.key)
    assert first is not None and first.watermark is not None
    shutil.copytree(table.snapshot_path(first.generation), table.snapshot_path(generation))
    watermark = replace(first.watermark, taken_at=datetime.now(UTC))
    taken = GenerationEvent(
        table.key, generation, GenerationStatus.COMMITTED, watermark=watermark, schema_json=first.schema_json
    )
    ledger.record_generation(taken)


def bench(
    spark: object, size: int, root: Path, driver_merge_max_rows: int | None = None
) -> tuple[float, float, float, float]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)
    config = make_config(root, driver_merge_max_rows=driver_merge_max_rows)
    table = lake_table(config, config.tables[0])
    ledger = Ledger(config.lake.root)
    commit_generation(spark, table, ledger, size)
    started = time.perf_counter()
    apply_current(spark, ledger, table)  # first load: current is a new table
    first_load_s = time.perf_counter() - started
    commit_next_generation(table, ledger, "g2")
    started = time.perf_counter()
    rebuilt = apply_current(spark, ledger, table)  # the baseline: current rebuilt in place
    rebuild_s = time.perf_counter() - started
    assert rebuilt.rebuilt and rebuilt.generation == "g2" and rebuilt.rows == size, rebuilt

    row = "struct<id:bigint,v:bigint,s:string>"
    roll = F.col("roll")  # one draw per change: its op and its key agree (an insert gets a new key)
    changes = (
        spark.range(CHANGES)
        .select("id", F.rand(7).alias("roll"), F.rand(11).alias("pick"))
        .select(
            F.lit(0).alias("kafka_partition"),
            F.col("id").alias("kafka_offset"),
            F.current_timestamp().alias("kafka_timestamp"),
            F.when(roll < 0.8, "u").when(roll < 0.9, "d").otherwise("c").alias("op"),
            F.lit(False).alias("is_tombstone"),
            (F.lit(2000) + F.col("id")).alias("commit_lsn"),
            (F.lit(2000) + F.col("id")).alias("lsn"),
            F.col("id").alias("tx_id"),
            F.current_timestamp().alias("source_ts"),
            F.lit(None).cast("string").alias("key_json"),
            F.when(roll >= 0.9, F.lit(size) + F.col("id")).otherwise((F.col("pick") * size).cast("long")).alias("k"),
        )
    )
    image = F.struct(F.col("k").alias("id"), (F.col("k") * 3).alias("v"), F.lit("changed").alias("s"))
    changes = changes.select(
        "*",
        F.when(F.col("op") == "d", image).otherwise(F.lit(None).cast(row)).alias("before"),
        F.when(F.col("op") != "d", image).otherwise(F.lit(None).cast(row)).alias("after"),
        F.array().cast("array<string>").alias("unavailable"),
        F.lit("w1").alias("window_start"),
    ).drop("k")
    changes.write.format("delta").mode("overwrite").partitionBy("window_start").save(table.changelog_path)
    decoded = spark.read.format("delta").load(table.changelog_path).cache()
    decoded.count()  # the stream apply holds its decoded batch in memory
    pristine = spark.read.format("delta").load(table.current_path).count()
    copy_current(spark, table.current_path, f"{root}/pristine")
    copy_current(spark, table.deletes_path, f"{root}/pristine_deletes")
    position = ledger.current(table.key)
    assert position is not None
    generation = ledger.committed(table.key)
    assert generation is not None
    started = time.perf_counter()
    streamed = apply_decoded(spark, ledger, table, generation, position, decoded, summarize(decoded), {0: CHANGES})
    stream_s = time.perf_counter() - started
    assert streamed.changes_applied == CHANGES and streamed.rows != pristine, streamed
    decoded.unpersist()

    copy_current(spark, f"{root}/pristine", table.current_path)
    copy_current(spark, f"{root}/pristine_deletes", table.deletes_path)
    ledger.record_current(table.key, replace(position, updated_at=datetime.now(UTC)))  # the newest record wins
    ledger.record_window(table.key, WindowPlan("w1", (WindowRange(0, 0, CHANGES, "w2"),), reused=False))
    started = time.perf_counter()
    result = apply_current(spark, ledger, table)
    window_s = time.perf_counter() - started
    assert result.changes_applied == CHANGES and result.rows == streamed.rows, (result, streamed)
    return first_load_s, rebuild_s, stream_s, window_s


def copy_current(spark: object, source: str, target: str) -> None:
    """A byte-for-byte copy of a Delta table (its log and files), so both merges start equal."""
    import shutil

    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 10_000_000])
    parser.add_argument(
        "--java-options", default="", help="more driver JVM options, e.g. -XX:+UseG1GC (Java's default collector)"
    )
    parser.add_argument(
        "--driver-merge-max-rows", type=int, default=None,
        help="lake.driver_merge_max_rows (default: the platform's, 1M): currents up to it merge by delta-rs",
    )  # fmt: skip
    args = parser.parse_args()
    conf = {}  # the platform's defaults: what a user's local driver runs
    if args.java_options:
        conf["spark.driver.extraJavaOptions"] = args.java_options
    spark = get_spark_session(
        SparkConfig(master="local[*]", jars_dir=str(REPO_ROOT / ".cdc" / "jars" / "spark"), conf=conf)
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_merge_") as tmp:
        bench(spark, 1000, Path(tmp) / "warmup", args.driver_merge_max_rows)  # JIT and Delta code paths warm
        for size in args.sizes:
            results.append((size, *bench(spark, size, Path(tmp) / str(size), args.driver_merge_max_rows)))
    print(
        f"\nmerge of {CHANGES} changes into current (same run; baseline = current rebuilt in place from a new "
        "generation; first load = a new current, with Delta's first auto compaction); lake.driver_merge_max_rows: "
        f"{'the default' if args.driver_merge_max_rows is None else args.driver_merge_max_rows}"
    )
    for size, first_load_s, rebuild_s, stream_s, window_s in results:
        print(
            f"rows={size:>10}  first load {first_load_s:7.2f} s  rebuild {rebuild_s:7.2f} s  "
            f"stream merge {stream_s:6.2f} s (/rebuild {stream_s / rebuild_s:.3f})  "
            f"window merge {window_s:6.2f} s (/rebuild {window_s / rebuild_s:.3f})"
        )
    if len(results) > 1:
        (small, _, _, small_merge, _), (large, _, _, large_merge, _) = results[0], results[-1]
        print(f"table grew {large / small:.0f}x; stream merge time grew {large_merge / small_merge:.2f}x")


if __name__ == "__main__":
    main()
