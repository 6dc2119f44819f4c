"""The Spark session the platform runs on.

``local[*]`` by default; ``spark.master``, the lake URI and any Spark conf come from the
config so the same code runs on a cluster. Delta Lake and the PostgreSQL JDBC driver
are jars that scripts/bootstrap.sh resolved with mvn into ``.cdc/jars/spark`` (Spark's
own ``--packages`` resolution also works here, but is unpinned and slower).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_platform.config.model import SparkConfig
from cdc_platform.devstack.profiles import state_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


class SparkSetupError(RuntimeError):
    pass


def spark_jars_dir() -> Path:
    return Path(os.environ.get("CDC_SPARK_JARS_DIR") or state_root() / "jars" / "spark")


def extra_jars() -> list[str]:
    """Jars to add to Spark: those in ``.cdc/jars/spark`` whose artifact pyspark does not
    already ship (Maven's 'provided' scope does not keep all of Spark's own deps out)."""
    import pyspark

    jars_dir = spark_jars_dir()
    ours = sorted(jars_dir.glob("*.jar"))
    if not any(p.name.startswith("delta-spark_") for p in ours):
        raise SparkSetupError(
            f"Delta Lake jars not found in {jars_dir}; run scripts/bootstrap.sh (it resolves them with mvn)"
        )
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(p) for p in ours if _artifact(p.name) not in shipped]


def _artifact(jar_name: str) -> str:
    match = _VERSIONED_JAR.match(jar_name)
    return match["artifact"] if match else jar_name


def prepare_spark_environment() -> None:
    """Process environment Spark reads at start-up: loopback only, and Python workers (the
    data-source planner reads PYSPARK_PYTHON, not spark.pyspark.python) on the venv's
    interpreter. Explicit settings in the environment win."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def session_conf(spark: SparkConfig) -> dict[str, str]:
    conf = {
        "spark.jars": ",".join(extra_jars()),
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
        # source column names may hold spaces and other characters Parquet/Delta refuse
        # ("Order Id"): every table the platform creates maps columns by name
        "spark.databricks.delta.properties.defaults.columnMapping.mode": "name",
        # Python workers (the changelog's Kafka data source) run the driver's interpreter,
        # i.e. the project's venv, not whatever python3 is first on PATH
        "spark.pyspark.python": sys.executable,
    }
    conf.update(spark.conf)  # the user's settings win
    return conf


def get_spark_session(spark: SparkConfig, app_name: str | None = None) -> SparkSession:
    from pyspark.sql import SparkSession

    prepare_spark_environment()
    builder = SparkSession.builder.master(spark.master).appName(app_name or spark.app_name)
    for key, value in session_conf(spark).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
