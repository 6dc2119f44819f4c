"""Spark local mode with the project's Delta jars: write, read back, time travel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_platform.config.model import SparkConfig
from cdc_platform.lake.session import NOISY_LOGGERS, class_archive, get_spark_session, jar_settings, session_conf


def test_extra_jars_bring_delta_and_jdbc_but_not_sparks_own() -> None:
    names = [Path(j).name for j in jar_settings(SparkConfig())["spark.jars"].split(",")]
    assert any(n.startswith("delta-spark_4.2_2.13-") for n in names)
    assert any(n.startswith("postgresql-") for n in names)
    assert not any(n.startswith(("hadoop-client-api", "scala-library", "parquet-hadoop")) for n in names)


def test_user_conf_overrides_defaults() -> None:
    conf = session_conf(SparkConfig(master="spark://h:7077", conf={"spark.sql.shuffle.partitions": "64"}))
    assert conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"


def test_a_local_session_never_declares_its_own_executor_lost() -> None:
    """Local mode: the executor is the driver's JVM, and its heartbeat thread can die on a
    Spark race (SPARK-59451); 120 s later the driver declared it lost mid-batch, dropping
    cached blocks. A cluster's executors keep Spark's heartbeat timeout."""
    key = "spark.storage.blockManagerHeartbeatTimeoutMs"
    assert int(session_conf(SparkConfig(master="local[2]"))[key]) >= 30 * 24 * 3600 * 1000
    for cluster in ("spark://h:7077", "local-cluster[2,1,1024]"):  # executors of their own
        assert key not in session_conf(SparkConfig(master=cluster))
    spark = get_spark_session(SparkConfig(master="local[2]"))  # the session users run carries it
    assert int(spark.sparkContext.getConf().get(key)) >= 30 * 24 * 3600 * 1000


def test_the_session_users_run_maps_the_class_archive_and_runs_the_parallel_collector() -> None:
    """scripts/bootstrap.sh built the driver's class archive for this Java and pyspark, and the
    driver JVM of the platform's session maps it (its classes are not parsed again)."""
    archive = class_archive(SparkConfig())
    assert archive is not None and archive.is_file(), f"no class archive at {archive}: run scripts/bootstrap.sh"
    spark = get_spark_session(SparkConfig(master="local[2]"))
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pid = jvm.java.lang.ProcessHandle.current().pid()
    assert str(archive) in Path(f"/proc/{pid}/maps").read_text()
    # and, local mode, the parallel collector (G1's young generation is "G1 Young Generation")
    collectors = {b.getName() for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    assert collectors == {"PS Scavenge", "PS MarkSweep"}, collectors


def test_delta_round_trip(tmp_path: Path) -> None:
    spark = get_spark_session(SparkConfig(master="local[2]"))
    path = str(tmp_path / "t")
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string").write.format("delta").save(path)
    spark.createDataFrame([(3, "c")], "id long, v string").write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [1, 2, 3]
    first = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assert first.count() == 2


def test_every_session_users_run_quiets_the_per_batch_warnings_and_keeps_the_others(tmp_path: Path) -> None:
    """Every Delta MERGE unpersists its materialized source and every Kafka read sets the
    platform's group id, and Spark warned about each once per micro-batch, drowning the
    apply log's real warnings. Both sessions: ``cdc-platform apply`` and Dagster runs take
    theirs from the PySpark resource, verify and the faults suite from get_spark_session."""
    from cdc_platform.orchestration.resources import CdcSparkResource

    config = tmp_path / "cdc_platform.yaml"
    config.write_text(
        "sources: {bm: {database: bm, user: u, password_env: UNUSED}}\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        f"lake: {{root: '{tmp_path / 'lake'}'}}\n"
        "tables: [{name: bm.public.t, primary_key: [id]}]\n"
    )
    spark = get_spark_session(SparkConfig(master="local[2]"))
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    configurator, level, manager = (
        jvm.org.apache.logging.log4j.core.config.Configurator,
        jvm.org.apache.logging.log4j.Level,
        jvm.org.apache.logging.log4j.LogManager,
    )

    def levels() -> set[str]:
        return {str(manager.getLogger(name).getLevel()) for name in NOISY_LOGGERS}

    for make_session in (
        lambda: CdcSparkResource.for_config(str(config)).spark_session,
        lambda: get_spark_session(SparkConfig(master="local[2]")),
    ):
        for name in NOISY_LOGGERS:  # as a new JVM has them
            configurator.setLevel(name, level.WARN)
        make_session()
        assert levels() == {"ERROR"}
        assert str(manager.getLogger("org.apache.spark.sql.delta.DeltaLog").getLevel()) == "WARN"
    assert "org.apache.spark.rdd.MapPartitionsRDD" in NOISY_LOGGERS


def _projection_code_generated(spark: Any) -> bool:
    """Whether a projection built now is generated code (not Spark's interpreted one)."""
    jvm = spark.sparkContext._jvm
    schema = spark.range(1).select("id")._jdf.schema()
    projection = jvm.org.apache.spark.sql.catalyst.expressions.UnsafeProjection.create(schema)
    return "Interpreted" not in projection.getClass().getName()


def test_the_suites_session_interprets_projections(spark: Any) -> None:
    """The in-process session of the tests skips generating projection code (conftest.py)..."""
    assert not _projection_code_generated(spark)


@pytest.mark.spark_codegen
def test_a_value_case_runs_generated_projections_as_production_does(spark: Any) -> None:
    """... except for the tests marked spark_codegen."""
    assert _projection_code_generated(spark)


def test_building_a_tables_decoding_makes_no_call_site_round_trips(spark: Any) -> None:
    """PySpark 4 records the Python call site of every DataFrame and Column call in the JVM
    (about ten py4j round trips a call) unless the session turns it off. The JVM decoding of
    one five-column table is thousands of Column calls, built for each table an apply
    starts: 9 500 round trips (0.9 s) with call sites, 2 200 (0.3 s) without."""
    from cdc_platform.devtools.py4j_trips import RoundTrips
    from cdc_platform.envelope.encoding import ValueEncoding
    from cdc_platform.envelope.pgtypes import builtin_type
    from cdc_platform.lake import jvm_decode
    from cdc_platform.model.tables import LakeColumn, TableSchema

    types = [builtin_type(oid) for oid in (23, 25, 1184, 16, 20)]  # int4, text, timestamptz, bool, int8
    assert all(t is not None for t in types)
    fresh = TableSchema(tuple(LakeColumn(f"call_sites_{i}", t) for i, t in enumerate(types) if t), ("call_sites_0",))
    with RoundTrips() as trips:
        jvm_decode._stages(spark, fresh, ValueEncoding())  # a schema no test built before: built now
    assert trips.count < 4000, trips.count
