"""The correctness bar: after a mixed workload, current equals the source exactly —
with the snapshot taken during the workload, windows materialized out of order and one
of them twice, and the merge applied incrementally."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.spark.changelog import materialize_window
from cdc_platform.spark.current import apply_changes, current_path
from cdc_platform.spark.snapshot import take_snapshot
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.test_capture_faults import DDL, Workload

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"])


def test_current_equals_source_after_a_mixed_workload(env: CaptureEnv, spark: Any, tmp_path: Path) -> None:
    for t in ("items", "lines"):
        env.configure_table(t, "changelog: {grace_s: 0}")
    config = env.config
    tables = [config.table(f"cap.{env.schema}.{t}") for t in ("items", "lines")]
    env.run_until_caught_up()
    for table in tables:  # warm the JVM's JDBC path; g1 below is the latest generation
        take_snapshot(spark, config, table, "g0")
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)

    # the bootstrap generation, taken while the workload runs
    _generation_during_workload(env, spark, tables, "g1", Workload(env, seconds=12, seed=3), after_s=2.5)
    t_end = datetime.now(UTC).replace(microsecond=0)
    size = (t_end - t0) / 4
    windows = [(t0 + i * size, t0 + (i + 1) * size) for i in range(4)]

    for table in tables:
        for i in (2, 0):  # out of order
            materialize_window(spark, config, table, *windows[i])
        first = apply_changes(spark, config, table)
        assert first.rebuilt and first.generation == "g1"
        for i in (3, 1, 2):  # the rest, and window 2 again
            materialize_window(spark, config, table, *windows[i])
        second = apply_changes(spark, config, table)
        assert not second.rebuilt and second.changes_applied > 0
        assert not second.waiting_for

    _assert_current_equals_source(spark, config, tables, tmp_path / "verify1")

    # a new generation (a rehydration) taken while the workload runs: current rebuilds from
    # it and then follows the changelog after its watermark
    workload = Workload(env, seconds=8, seed=4, first_id=100_000)
    _generation_during_workload(env, spark, tables, "g2", workload, after_s=2)
    t_next = datetime.now(UTC).replace(microsecond=0)
    for table in tables:
        materialize_window(spark, config, table, t_end, t_next)
        third = apply_changes(spark, config, table)
        assert third.rebuilt and third.generation == "g2"
    _assert_current_equals_source(spark, config, tables, tmp_path / "verify2")


def _generation_during_workload(
    env: CaptureEnv, spark: Any, tables: list[Any], generation: str, workload: Workload, after_s: float
) -> None:
    """Capture streams and the workload runs while a generation of every table is taken;
    returns once capture has every change in Kafka and their timestamps are in the past."""
    with env.running_capture():
        workload.start()
        time.sleep(after_s)
        for table in tables:
            take_snapshot(spark, env.config, table, generation)
        assert workload.is_alive(), (
            f"generation {generation} must be taken while the workload runs ({workload.error!r})"
        )
        workload.join()
        assert workload.error is None
    env.run_until_caught_up()
    time.sleep(1.1)


def _assert_current_equals_source(spark: Any, config: Any, tables: list[Any], root: Path) -> None:
    verify = config.model_copy(update={"lake": config.lake.model_copy(update={"root": str(root)})})
    for table in tables:
        truth = spark.read.format("delta").load(take_snapshot(spark, verify, table, "truth").path)
        current = spark.read.format("delta").load(current_path(config, table)).drop("_cdc_commit_lsn", "_cdc_lsn")
        missing = truth.exceptAll(current)
        extra = current.exceptAll(truth)
        assert truth.count() > 100
        assert (missing.count(), extra.count()) == (0, 0), (missing.limit(5).collect(), extra.limit(5).collect())


@pytest.fixture
def types_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    from cdc_platform_tests.cases.pg_types import type_cases_ddl

    yield from make_capture_env(demo_db, tmp_path, type_cases_ddl(), ["type_cases"])


def test_every_type_case_through_the_changelog_equals_the_source(
    types_env: CaptureEnv, spark: Any, tmp_path: Path
) -> None:
    from cdc_platform_tests.cases.pg_types import TYPE_CASES

    env = types_env
    env.configure_table("type_cases", "changelog: {grace_s: 0}")
    config = env.config
    table = config.table(f"cap.{env.schema}.type_cases")
    env.run_until_caught_up()
    take_snapshot(spark, config, table, "g1")  # empty: every row arrives through the changelog
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.app() as app:
        for name, _, literal in TYPE_CASES:
            app.execute(f"INSERT INTO type_cases (case_name, {name}) VALUES ('{name}', {literal})".encode())
        app.execute("UPDATE type_cases SET c_text = 'changed' WHERE case_name = 'c_jsonb'")
        app.execute("DELETE FROM type_cases WHERE case_name = 'c_inet'")
    env.run_until_caught_up()
    time.sleep(1.1)
    materialize_window(spark, config, table, t0, datetime.now(UTC).replace(microsecond=0))
    result = apply_changes(spark, config, table)
    assert result.changes_applied == len(TYPE_CASES) + 2
    verify = config.model_copy(update={"lake": config.lake.model_copy(update={"root": str(tmp_path / "verify")})})
    truth = spark.read.format("delta").load(take_snapshot(spark, verify, table, "truth").path)
    current = spark.read.format("delta").load(current_path(config, table)).drop("_cdc_commit_lsn", "_cdc_lsn")
    assert truth.schema == current.schema
    assert truth.count() == len(TYPE_CASES) - 1
    missing, extra = truth.exceptAll(current).collect(), current.exceptAll(truth).collect()
    assert (missing, extra) == ([], [])
