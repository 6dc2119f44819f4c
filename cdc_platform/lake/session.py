"""The Spark session the platform runs on.

``local[*]`` by default; ``spark.master``, the lake URI and any Spark conf come from the
config so the same code runs on a cluster. The jars pyspark does not ship (Delta Lake,
the JDBC drivers, Spark's Kafka source) come from ``spark.jars_dir`` (scripts/bootstrap.sh resolves them with
mvn into ``.cdc/jars/spark``), else ``$CDC_SPARK_JARS_DIR``, else Spark downloads the
pinned packages from Maven Central itself (``spark.jars.packages``): an installed package
needs no checkout.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.config.model import LakeConfig, SparkConfig
from cdc_platform.lake.object_store import give_session_object_store, spark_s3a_conf
from cdc_platform.model.errors import FatalError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JARS_DIR_ENV = "CDC_SPARK_JARS_DIR"
# the same versions as stack/jvm/spark/pom.xml (pyspark 4.2.0, delta-spark 4.4.0)
PINNED_PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.postgresql:postgresql:42.7.8",
    "org.mariadb.jdbc:mariadb-java-client:3.5.11",
    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
)
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def jars_dir(spark: SparkConfig) -> Path | None:
    chosen = spark.jars_dir or os.environ.get(JARS_DIR_ENV)
    return Path(chosen) if chosen else None


def jar_settings(spark: SparkConfig) -> dict[str, str]:
    """``spark.jars`` from the jars directory (skipping artifacts pyspark already ships:
    Maven's 'provided' scope does not keep all of Spark's own deps out), or the pinned
    ``spark.jars.packages`` when no directory is set."""
    directory = jars_dir(spark)
    if directory is None:
        return {"spark.jars.packages": ",".join(PINNED_PACKAGES)}
    import pyspark

    ours = sorted(directory.glob("*.jar"))
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return {"spark.jars": ",".join(str(p) for p in ours if _artifact(p.name) not in shipped)}


def check_jars(spark: SparkConfig) -> None:
    """A configured jars directory must hold Delta Lake (a clear error, not a ClassNotFound)."""
    directory = jars_dir(spark)
    if directory is not None and not any(p.name.startswith("delta-spark_") for p in directory.glob("*.jar")):
        raise FatalError(
            f"Delta Lake jars not found in {directory} (spark.jars_dir or ${JARS_DIR_ENV}); run "
            "scripts/bootstrap.sh (it resolves them with mvn), or unset both to let Spark download the pinned "
            "packages from Maven Central"
        )


def _artifact(jar_name: str) -> str:
    match = _VERSIONED_JAR.match(jar_name)
    return match["artifact"] if match else jar_name


def prepare_spark_environment() -> None:
    """Process environment Spark reads at start-up: loopback only, and Python workers (the
    data-source planner reads PYSPARK_PYTHON, not spark.pyspark.python) on the venv's
    interpreter. Explicit settings in the environment win."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


# Delta tables whose log a driver keeps in memory: the changelog, current and history of the
# ~20 tables a busy driver applies most recently
DELTA_LOG_CACHE_SIZE = 64


def session_conf(spark: SparkConfig, lake: LakeConfig | None = None) -> dict[str, str]:
    """The platform's Spark conf; with ``lake``, also its object store's (never its secrets:
    ``give_session_object_store`` adds those once the session runs)."""
    conf = {
        **jar_settings(spark),
        "spark.master": spark.master,
        "spark.app.name": spark.app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        # loopback only: the driver and (if enabled) its UI never listen on other interfaces
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.ui.showConsoleProgress": "false",
        # Delta rebuilds table state with this many tasks; 50 (its default) is all overhead locally
        "spark.databricks.delta.snapshotPartitions": "4",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Delta keeps every table's log and snapshot it touched for an hour, up to 10 000 of
        # them: ~2.6 MB each even for tiny tables, so a driver applying 200 tables (three Delta
        # tables each) filled a 1 GB heap and collected garbage for good. A table evicted
        # re-reads its log on its next batch (docs/benchmarks.md, "Many tables of one source")
        "spark.databricks.delta.delta.log.cacheSize": str(DELTA_LOG_CACHE_SIZE),
        # Lake files every engine reads the same: timestamps as Parquet TIMESTAMP_MICROS (INT96
        # is deprecated, and delta-rs reads it as nanoseconds, wrapping instants outside
        # 1677-2262), and dates and timestamps proleptic Gregorian, never rebased through
        # the hybrid Julian calendar. Column mapping is set per table (lake/tables.py).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
        # PySpark 4 records the Python call site of every DataFrame and Column call in the JVM
        # (for the "DataFrame query context" of runtime errors): about ten py4j round trips per
        # call. Building one table's decoding took 9 500 of them (0.9 s) with it, 2 200 (0.3 s)
        # without, and every batch builds its frames anew (docs/benchmarks.md, stop 74).
        # Errors still name the expression; set it true in spark.conf to see the call sites.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # Python workers (the changelog's Kafka data source) run the driver's interpreter,
        # i.e. the project's venv, not whatever python3 is first on PATH
        "spark.pyspark.python": sys.executable,
    }
    if _local(spark.master):
        conf.update(LOCAL_MODE_CONF)
        conf["spark.sql.shuffle.partitions"] = str(SHUFFLE_PARTITIONS_PER_LOCAL_THREAD * local_threads(spark.master))
    if lake is not None and lake.s3 is not None:
        conf.update(spark_s3a_conf(lake.s3))
    conf.update(spark.conf)  # the user's settings win
    options = driver_java_options(spark)
    if options:
        conf[DRIVER_JAVA_OPTIONS] = options
    return conf


# The long-running apply's driver holds every table's plans, Delta snapshots and a pass's
# broadcast relations at once: the demo's ten tables kept 560-820 MB live after a full GC,
# and at Spark's default 1g heap that driver spent its time collecting garbage within
# 12-18 minutes, then ran out of memory (docs/benchmarks.md, "Freshness over a long demo
# run"). A Dagster run or a CLI command is short and keeps Spark's default.
LONG_RUNNING_DRIVER_MEMORY = "2g"


def long_running_conf(spark: SparkConfig, lake: LakeConfig | None = None) -> dict[str, str]:
    """``session_conf`` for a process that applies for days: a larger driver heap unless the
    config sets one (``spark.conf``)."""
    conf = session_conf(spark, lake)
    conf.setdefault("spark.driver.memory", LONG_RUNNING_DRIVER_MEMORY)
    return conf


def local_threads(master: str) -> int:
    """The task threads of a local master: local -> 1, local[N] -> N, local[*] -> the cores."""
    match = _LOCAL_MASTER.fullmatch(master.strip())
    if match is None or match[1] is None:
        return 1
    if match[1] == "*":
        return os.cpu_count() or 1
    return max(1, int(match[1]))


# local, local[N], local[*], local[N, F] (F: task failures allowed); not local-cluster[…],
# whose executors are JVMs of their own
_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def _local(master: str) -> bool:
    """One JVM does everything: the driver is the executor."""
    return _LOCAL_MASTER.fullmatch(master.strip()) is not None


def driver_java_options(spark: SparkConfig) -> str | None:
    """The driver JVM's options: the class archive, the collector and JIT thresholds in local
    mode, then the user's own (after ours, so theirs win). A user who sets class sharing up
    themselves (-Xshare, their own archive, or dumping one) gets only theirs: beside ours,
    -XX:ArchiveClassesAtExit stops the JVM from starting."""
    user = spark.conf.get(DRIVER_JAVA_OPTIONS, "")
    options = [] if _CLASS_SHARING.search(user) else [driver_archive_option(spark)]
    if _local(spark.master):
        if not _COLLECTOR.search(user):  # two collectors: the JVM refuses to start
            options.append(LOCAL_MODE_COLLECTOR)
        options.append(LOCAL_MODE_LAZIER_C2)
    options.append(user)
    return " ".join(o for o in options if o) or None


# In local mode the one JVM does all of Spark's work, a throughput job, on a 1 GB heap by
# default: G1 (Java's default) ran a concurrent mark cycle every second or so there and
# paused 17-21 s in a 120 s test of history batches, against 3.7 s for the parallel
# collector, and the test took 105-107 s instead of 119-121 s (docs/benchmarks.md).
LOCAL_MODE_COLLECTOR = "-XX:+UseParallelGC"
# ... and its JIT compiles on the same few cores as that work (and PostgreSQL, Kafka, capture
# beside it). With Java's thresholds C2 compiles every lukewarm method of Spark's planner: a
# cold `cdc-platform apply --once` of one small batch spent 50-68 CPU-s on 2 cores, and a
# loop of 20-change MERGEs 180-211. Ten times the thresholds keep C2 for the hot code and
# took 43-44 and 155-157 CPU-s, the MERGEs as fast (2.92-2.95 s against 2.86-3.27 s), where
# C1 alone (-XX:TieredStopAtLevel=1) made them 40-55 % slower (docs/benchmarks.md).
LOCAL_MODE_LAZIER_C2 = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
    "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
)
_COLLECTOR = re.compile(r"-XX:\+Use\w+GC\b")
_CLASS_SHARING = re.compile(
    r"-Xshare:|-XX:(?:SharedArchiveFile|ArchiveClassesAtExit|SharedClassListFile|DumpLoadedClassList)=|"
    r"-XX:[+-]AutoCreateSharedArchive\b"
)


# The driver JVM's class-data-sharing archive: Spark's and Scala's classes as a JVM that ran
# the platform's Delta work loaded them, mapped read-only instead of parsed and verified again
# by every new driver (each Dagster run, each start of the apply). scripts/bootstrap.sh builds
# it (devtools/spark_archive.py); without it the JVM starts as usual. Measured in
# bench/bench_startup.py. Only the driver: executors of a cluster are started by Spark.
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
CLASS_ARCHIVE_DIR = "spark-class-archive"


def class_archive(spark: SparkConfig) -> Path | None:
    """Where this machine's driver class archive lives: beside the jars directory, named for
    the Java and pyspark it was built with (another JVM build, Spark version or install has
    its own, and until built none). None without a jars directory."""
    directory = jars_dir(spark)
    if directory is None:
        return None
    return directory.resolve().parent / CLASS_ARCHIVE_DIR / f"spark-{archive_key()}.jsa"


def archive_key() -> str:
    import pyspark

    java = java_binary()
    # pyspark's place too: the archive holds its jars' paths, and another install's are refused
    # (with a warning at every start) even at the same version
    facts = [pyspark.__version__, pyspark.__file__, str(java), str(java.stat().st_mtime_ns) if java else "no java"]
    return hashlib.sha256("\0".join(facts).encode()).hexdigest()[:16]


def java_binary() -> Path | None:
    """The java spark-submit starts: $JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def driver_archive_option(spark: SparkConfig) -> str | None:
    archive = class_archive(spark)
    if archive is None or not archive.is_file():
        return None
    return f'"-XX:SharedArchiveFile={archive}"' if " " in str(archive) else f"-XX:SharedArchiveFile={archive}"


# In local mode the one executor is the driver's own JVM, so its heartbeat can only time out
# by a false alarm, and one happens: a race in accumulator deserialization (SPARK-59451, a
# NullPointerException in PartitionKeyedAccumulator.isZero logged by "executor-heartbeater")
# kills the heartbeat thread for good, and 120 s later the driver declared its own executor
# lost ("Removing executor driver with no recent heartbeats"), dropping cached blocks and
# shuffle output mid-batch. Seen in the long-running apply's log during the fault suite.
LOCAL_MODE_CONF = {
    "spark.storage.blockManagerHeartbeatTimeoutMs": str(365 * 24 * 3600 * 1000),
    # Spark caches the classes it generates for a query's plan; at its default (100 plans)
    # a driver applying many tables' batches, each table's merge its own plans, evicts
    # and recompiles them every batch (Janino, then the JIT again)
    "spark.sql.codegen.cache.maxEntries": "2000",
    # Delta rebuilds a table's state (its files) at each new version in this many tasks, and
    # each task generates the projection code of Delta's nested actions anew: one task per
    # state costs 13-15 % less CPU than four in a test of history batches (docs/benchmarks.md),
    # and the lake's tables are small enough in files for one thread to replay their logs
    "spark.databricks.delta.snapshotPartitions": "1",
}
# A local driver's tasks share its threads: shuffle partitions beyond a few per thread are
# per-task overhead only (AQE coalesces the reduce side, not the map side's files)
SHUFFLE_PARTITIONS_PER_LOCAL_THREAD = 2


def get_spark_session(spark: SparkConfig, app_name: str | None = None, lake: LakeConfig | None = None) -> SparkSession:
    """The platform's session; pass ``lake`` when the lake may be on object storage."""
    from pyspark.sql import SparkSession

    check_jars(spark)
    prepare_spark_environment()
    builder = SparkSession.builder
    for key, value in session_conf(spark, lake).items():
        builder = builder.config(key, value)
    if app_name:
        builder = builder.appName(app_name)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    quiet_known_noise(session)
    give_session_object_store(session, lake)
    return session


# Driver loggers whose warnings say nothing a user can act on, once per micro-batch, and
# drowned the apply log's real warnings: every Delta MERGE materializes its source as a
# local checkpoint and unpersists it (MapPartitionsRDD: its lineage "cannot be recomputed"),
# and every Kafka read sets the platform's group id (KafkaSourceProvider: "not recommended",
# for subscribing queries sharing a group; the platform assigns partitions, commits nothing).
NOISY_LOGGERS = ("org.apache.spark.rdd.MapPartitionsRDD", "org.apache.spark.sql.kafka010.KafkaSourceProvider")


def quiet_known_noise(session: SparkSession) -> None:
    """Every session of the platform (this module's, and Dagster's PySpark resource's)."""
    jvm = session.sparkContext._jvm
    assert jvm is not None
    for name in NOISY_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)


def spark_resource_conf(spark: SparkConfig) -> dict[str, Any]:
    """The conf for Dagster's PySpark resource (the same session ``get_spark_session`` builds)."""
    return dict(session_conf(spark))
