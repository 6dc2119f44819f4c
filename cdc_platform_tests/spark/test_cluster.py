"""The platform on a Spark standalone cluster, chosen by ``spark.master`` alone: a master
and a worker of the test stack (``devtools/stack/spark_cluster.py``, pyspark's own jars),
so every task runs in an executor JVM of its own and its Python workers, as on a cluster
of many machines. Until this test the platform's Spark work only ever ran in local mode,
where the driver is the executor: what a task needs that only the driver had (a jar, a
password, a file, the interpreter) would have gone unnoticed.

A chunked, incremental generation is taken while a workload writes (JDBC reads in the
tasks, the watermarks), then ``cdc-platform apply --once`` applies what was captured
(Spark's Kafka source, the JVM and Python decoders, the changelog append, the merge);
current then equals the source, and the master saw both applications finish.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.apply_process import ApplyProcess
from cdc_platform.devtools.lake import Lake
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.test_capture_faults import DDL, Workload
from cdc_platform_tests.integration.test_stack import LOOPBACK, listening
from cdc_platform_tests.spark.test_apply import PAUSE_S, STREAMED
from cdc_platform_tests.spark.test_current import assert_current_equals_source

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path, spark_cluster: Any) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"], source_yaml=STREAMED):
        with env.config_path.open("a") as config:  # the only change from a local run
            config.write(f"spark:\n  master: {spark_cluster.master_url}\n")
        for table in env.tables:  # several chunks and waves of a small table
            env.configure_table(table, "snapshot: {chunk_rows: 40, chunks_per_wave: 2}")
        yield env


def test_a_generation_and_the_stream_apply_run_on_a_spark_cluster(
    env: CaptureEnv, spark: Any, spark_cluster: Any, tmp_path: Path
) -> None:
    keys = [f"cap.{env.schema}.{t}" for t in env.tables]
    lake = Lake(env.config, spark)  # this process' local session reads the lake the cluster wrote
    home = tmp_path / "dagster"
    home.mkdir()
    run_env = {**os.environ, "DAGSTER_HOME": str(home)}
    started_ms = time.time() * 1000
    with env.running_capture():
        workload = Workload(env, seconds=None, seed=5, pause_s=PAUSE_S)
        workload.start()
        workload.wait_for(40)
        cli = [str(Path(sys.executable).parent / "cdc-platform"), "--config", str(env.config_path)]
        snapshot = subprocess.run(
            [*cli, "snapshot", "--all"], env=run_env, capture_output=True, text=True, timeout=600, check=False
        )
        workload.wait_for(20)  # changes after the generation too
        workload.stop()
        assert workload.error is None
    assert snapshot.returncode == 0, snapshot.stdout[-2000:] + snapshot.stderr[-4000:]
    for key in keys:
        committed = lake.ledger.committed(key)
        assert committed is not None and committed.rows > 0, key
        chunks = lake.ledger.chunk_progress(key, committed.generation).written
        assert len(chunks) >= 3, (key, chunks)  # read in chunks, in waves
    env.run_until_caught_up()

    log = tmp_path / "apply.log"
    apply = ApplyProcess(env.config_path, "cap", log, {"DAGSTER_HOME": str(home)})
    apply.start("--once")
    assert apply.wait_exit(timeout_s=600) == 0, log.read_text()[-4000:]
    assert_current_equals_source(lake, keys, at_least=20)

    apps = [a for a in spark_cluster.state()["completedapps"] if a["starttime"] >= started_ms]
    assert len(apps) == 2 and {a["state"] for a in apps} == {"FINISHED"}, apps  # the generation's, the apply's
    for app in apps:  # their tasks ran in the worker's executors
        assert any("Running task" in log for log in spark_cluster.executor_logs(app["id"])), app


def test_the_cluster_listens_on_loopback_only(spark_cluster: Any) -> None:
    ports = (spark_cluster.master_port, spark_cluster.master_ui_port, spark_cluster.worker_port,
             spark_cluster.worker_ui_port)  # fmt: skip
    for port in ports:
        addresses = listening(port)
        assert addresses and set(addresses) <= LOOPBACK, (port, addresses)
