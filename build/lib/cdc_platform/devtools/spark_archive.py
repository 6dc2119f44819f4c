"""Builds the Spark driver's class archive (``lake/session.py``'s ``class_archive``).

A new driver JVM spends seconds parsing and verifying Spark's, Scala's and Hadoop's classes
before its first job: every Dagster run and every start of ``cdc-platform apply`` pays it.
Java's class-data sharing keeps them, as one JVM loaded them, in a file that later JVMs map
read-only. This module does the platform's kind of work (Delta writes, a MERGE with deletion
vectors, reads, window functions, JSON) on a scratch lake in a JVM started with
``-XX:ArchiveClassesAtExit``, which writes the archive as it exits.

scripts/bootstrap.sh runs it once per Java and pyspark (the archive's name is their key):

    python -m cdc_platform.devtools.spark_archive --jars-dir .cdc/jars/spark

Only classes of the JVM's own class path are archived (Spark's, from pyspark's jars); the
jars Spark adds itself (Delta, Kafka, JDBC) are loaded as before.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cdc_platform.config.model import SparkConfig
from cdc_platform.lake.session import DRIVER_JAVA_OPTIONS, class_archive, get_spark_session
from cdc_platform.model.errors import FatalError

BUILD_TIMEOUT_S = 900.0  # a warm-up of a minute on 2 cores; generous for a loaded machine


def build_class_archive(spark: SparkConfig, log_path: Path) -> tuple[Path, bool]:
    """The archive for this Java and pyspark, built unless it exists: (path, built now).
    Written under another name and renamed, so a JVM starting meanwhile maps a whole file
    or none; archives of other keys in its directory are removed."""
    archive = class_archive(spark)
    if archive is None:
        raise FatalError("no Spark jars directory: set spark.jars_dir or $CDC_SPARK_JARS_DIR (scripts/bootstrap.sh)")
    if archive.is_file():
        return archive, False
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    command = [sys.executable, "-m", "cdc_platform.devtools.spark_archive", "--warm-up", str(partial)]
    if spark.jars_dir:
        command += ["--jars-dir", spark.jars_dir]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False)
    if finished.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        code = finished.returncode
        raise FatalError(f"the Spark driver's class archive was not written (exit {code}); see {log_path}")
    for other in archive.parent.glob("spark-*.jsa"):
        other.unlink()
    os.replace(partial, archive)
    return archive, True


def warm_up(spark: SparkConfig, dump_to: Path) -> None:
    """In this process: a session whose JVM archives its classes at exit, the platform's
    kind of Delta work, then the JVM ended and waited for (it writes the archive as it exits)."""
    options = f"-XX:ArchiveClassesAtExit={dump_to}"
    session = get_spark_session(spark.model_copy(update={"conf": {**spark.conf, DRIVER_JAVA_OPTIONS: options}}))
    gateway: Any = session.sparkContext._gateway
    with tempfile.TemporaryDirectory(prefix="cdc-class-archive-") as scratch:
        delta_work(session, Path(scratch))
    session.stop()
    process = gateway.proc  # the JVM: it exits when its stdin closes
    process.stdin.close()
    process.wait(timeout=BUILD_TIMEOUT_S)


def delta_work(spark: Any, scratch: Path) -> None:
    """What the platform's Spark jobs do, small: typed rows into a partitioned Delta table,
    a MERGE with deletion vectors, latest-per-key with a window, JSON decoding, reads."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    path = str(scratch / "current")
    rows = spark.range(0, 2000).select(
        F.col("id"),
        (F.col("id") % 7).cast("int").alias("day"),
        F.concat(F.lit("name "), F.col("id").cast("string")).alias("name"),
        (F.col("id") / 3).cast("decimal(18,4)").alias("amount"),
        F.timestamp_seconds(F.col("id") * 60).alias("at"),
        F.to_json(F.struct(F.col("id").alias("k"), F.lit("v").alias("v"))).alias("payload"),
    )
    rows.write.format("delta").partitionBy("day").option("delta.enableDeletionVectors", "true").save(path)
    changes = rows.where("id % 5 = 0").withColumn("seq", F.col("id") % 3)
    latest = (
        changes.withColumn("rank", F.row_number().over(Window.partitionBy("id").orderBy(F.col("seq").desc())))
        .where("rank = 1")
        .drop("rank", "seq")
        .withColumn("payload", F.to_json(F.from_json("payload", "k long, v string")))
    )
    target = DeltaTable.forPath(spark, path)
    merge = target.alias("t").merge(latest.alias("s"), "t.id = s.id")
    merge.whenMatchedDelete("s.id % 2 = 0").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    spark.read.format("delta").load(path).where("day = 3").groupBy("day").agg(F.sum("amount")).collect()
    target.detail().first()
    target.history(1).first()
    spark.read.format("delta").load(path).count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--jars-dir", help="the Spark jars directory (default: $CDC_SPARK_JARS_DIR)")
    parser.add_argument("--log", default=".cdc/logs/spark-class-archive.log", help="the warm-up's output")
    parser.add_argument("--warm-up", metavar="ARCHIVE", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args(argv)
    spark = SparkConfig(master="local[2]", jars_dir=str(Path(args.jars_dir).resolve()) if args.jars_dir else None)
    if args.warm_up:
        warm_up(spark, Path(args.warm_up))
        return 0
    archive = class_archive(spark)
    if archive is not None and not archive.is_file():
        print(f"building the Spark driver's class archive (about a minute, once per Java and pyspark): {archive}")
    try:
        archive, built = build_class_archive(spark, Path(args.log))
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if built:
        print(f"built: {archive.stat().st_size // 2**20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
