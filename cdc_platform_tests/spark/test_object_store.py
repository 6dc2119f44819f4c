"""The lake on an S3-compatible store, chosen by config alone (``lake.root: s3a://…`` and
``lake.s3``): S3Proxy on the test stack (``devtools/stack/s3proxy.py``), a real S3 server
with signatures, listings and conditional puts, and nothing of the lake on a local disk.
Until this test every lake was a local directory, and a path handled as a file, a client
without the store's settings or a secret that only the driver had would have gone unnoticed.

Spark reaches the store through Hadoop's S3A, delta-rs (the ledger, the driver's appends and
merges, VACUUM) through its own client; both are configured from ``lake.s3``. Spark runs on
the test stack's standalone cluster, the production shape: its executors are JVMs of their
own, which have the store's key pair only if the tasks bring it. A chunked
generation is taken while a workload writes, ``cdc-platform apply`` streams what is captured,
and verify compares the lake with the source while both run (in the test's own session,
configured for the store as the CLI's is).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.devtools.apply_process import ApplyProcess
from cdc_platform.devtools.daemon import Daemon
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack.s3proxy import ACCESS_KEY_ID_ENV, SECRET_ACCESS_KEY_ENV
from cdc_platform.lake.driver_batch import row_bytes, table_rows
from cdc_platform.lake.object_store import give_session_object_store
from cdc_platform.lake.tables import lake_table
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.streaming import assert_verified, streaming_after_a_generation
from cdc_platform_tests.integration.test_capture_faults import DDL
from cdc_platform_tests.integration.test_stack import LOOPBACK, listening
from cdc_platform_tests.spark.test_apply import STREAMED
from cdc_platform_tests.spark.test_current import assert_current_equals_source

pytestmark = pytest.mark.integration

LOCAL_LAKE = "lake:\n  root: lake\n"


@pytest.fixture
def env(demo_db: Any, tmp_path: Path, s3_store: Any, spark_cluster: Any) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"], source_yaml=STREAMED):
        text = env.config_path.read_text()
        assert LOCAL_LAKE in text
        lake = (  # the only change from a local run
            f"lake:\n  root: {s3_store.bucket('lake')}/{env.schema}\n"
            f"  s3: {{endpoint: '{s3_store.endpoint}', path_style: true, "
            f"access_key_id_env: {ACCESS_KEY_ID_ENV}, secret_access_key_env: {SECRET_ACCESS_KEY_ENV}}}\n"
        )
        # on a Spark cluster too: its executors are JVMs of their own, which get the store's
        # key pair only with their tasks (the driver's environment is not theirs). One core
        # each, as on any shared cluster
        spark = f"spark:\n  master: {spark_cluster.master_url}\n  conf: {{spark.cores.max: '1'}}\n"
        env.config_path.write_text(text.replace(LOCAL_LAKE, lake) + spark)
        for table in env.tables:  # several chunks and waves of a small table
            env.configure_table(table, "snapshot: {chunk_rows: 40, chunks_per_wave: 8}")
        yield env


@pytest.mark.long_running
def test_the_lake_runs_on_an_s3_compatible_store(
    env: CaptureEnv, spark: Any, s3_store: Any, spark_cluster: Any, tmp_path: Path
) -> None:
    keys = [f"cap.{env.schema}.{t}" for t in env.tables]
    started_ms = time.time() * 1000
    config = env.config
    give_session_object_store(spark, config.lake)  # this process' session reads the lake the CLI wrote
    lake = Lake(config, spark)
    home = tmp_path / "dagster"
    home.mkdir()
    run_env = {**os.environ, "DAGSTER_HOME": str(home)}
    cli = [str(Path(sys.executable).parent / "cdc-platform"), "--config", str(env.config_path)]
    with dg.instance_for_test() as instance:  # the daemon's sensor reads the ledger and current on the store
        rehydration = Daemon(env.config_path, instance, log=lambda _m: None)
        requested = rehydration.evaluate("rehydration").run_requests or []
        assert sorted((r.tags["cdc/table"], r.tags["cdc/reason"]) for r in requested) == [
            (key, "bootstrap") for key in sorted(keys)
        ]
    log = tmp_path / "apply.log"
    apply = ApplyProcess(env.config_path, "cap", log, {"DAGSTER_HOME": str(home)})
    try:
        with streaming_after_a_generation(env, cli, run_env, apply, seed=7) as workload:
            workload.wait_for(20)  # changes after the generation, streamed
            workload.stop()
            assert workload.error is None
            assert_verified(lake, keys, apply)  # while capture and the apply run
    finally:
        apply.stop()
    for key in keys:
        committed = lake.ledger.committed(key)
        assert committed is not None and committed.rows > 0, key
        assert len(lake.ledger.chunk_progress(key, committed.generation).written) >= 2, key  # in chunks
    assert_current_equals_source(lake, keys, at_least=20)
    for key in keys:  # the driver's batch bounds read current's size from the store, not a fallback
        current = lake_table(config, config.table(key)).current_path
        per_row, rows = row_bytes(current)
        assert per_row is not None and per_row > 0 and rows is not None and rows > 0, (key, per_row, rows)
        assert table_rows(current) == rows
    with dg.instance_for_test() as instance:  # current exists on the store: nothing to rehydrate
        result = Daemon(env.config_path, instance, log=lambda _m: None).evaluate("rehydration")
        assert not result.run_requests, result

    # the generation's and the apply's applications ran their tasks in the cluster's executors
    apps = _applications_since(spark_cluster, started_ms, count=2)
    for app in apps:
        assert any("Running task" in log for log in spark_cluster.executor_logs(app["id"])), app

    # the lake is in the store, written by both engines, and nowhere on the local disk
    stored = s3_store.data / "lake" / env.schema
    assert (stored / "_ledger").is_dir()
    for table in env.tables:
        table_dir = next(stored.glob(f"cap/*{table}*"), None)
        assert table_dir is not None, sorted(p.name for p in stored.glob("cap/*"))
        assert any((table_dir / "current" / "_delta_log").glob("*.json")), table_dir
    assert not (env.config_path.parent / "lake").exists()


def test_the_store_listens_on_loopback_only(s3_store: Any) -> None:
    addresses = listening(s3_store.port)
    assert addresses and set(addresses) <= LOOPBACK, addresses


def _applications_since(cluster: Any, started_ms: float, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The applications the master lists as finished since ``started_ms``, once there are
    ``count`` (a stopped driver's application is listed once the master heard it end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        apps = [a for a in cluster.state()["completedapps"] if a["starttime"] >= started_ms]
        if len(apps) >= count or time.monotonic() > deadline:
            assert len(apps) >= count, apps
            return apps
        time.sleep(1)
