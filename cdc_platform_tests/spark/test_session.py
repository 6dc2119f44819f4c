"""Spark local mode with the project's Delta jars: write, read back, time travel."""

from __future__ import annotations

from pathlib import Path

from cdc_platform.config.model import SparkConfig
from cdc_platform.lake.session import get_spark_session, jar_settings, session_conf


def test_extra_jars_bring_delta_and_jdbc_but_not_sparks_own() -> None:
    names = [Path(j).name for j in jar_settings(SparkConfig())["spark.jars"].split(",")]
    assert any(n.startswith("delta-spark_4.2_2.13-") for n in names)
    assert any(n.startswith("postgresql-") for n in names)
    assert not any(n.startswith(("hadoop-client-api", "scala-library", "parquet-hadoop")) for n in names)


def test_user_conf_overrides_defaults() -> None:
    conf = session_conf(SparkConfig(master="spark://h:7077", conf={"spark.sql.shuffle.partitions": "64"}))
    assert conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"


def test_delta_round_trip(tmp_path: Path) -> None:
    spark = get_spark_session(SparkConfig(master="local[2]"))
    path = str(tmp_path / "t")
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string").write.format("delta").save(path)
    spark.createDataFrame([(3, "c")], "id long, v string").write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [1, 2, 3]
    first = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assert first.count() == 2


def test_the_merge_sources_lineage_warning_is_quiet_and_other_warnings_are_not() -> None:
    """Every Delta MERGE unpersists its materialized source and Spark warned about it once
    per micro-batch, drowning the apply log's real warnings."""
    spark = get_spark_session(SparkConfig(master="local[2]"))
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    manager = jvm.org.apache.logging.log4j.LogManager
    assert str(manager.getLogger("org.apache.spark.rdd.MapPartitionsRDD").getLevel()) == "ERROR"
    assert str(manager.getLogger("org.apache.spark.sql.delta.DeltaLog").getLevel()) == "WARN"
