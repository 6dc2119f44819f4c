"""The stream apply's pure rules: batch keys and partitions, the next batch's offsets, its
plan in the ledger, a table's health, the config block, and the crash points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.config import ConfigError, load_config
from cdc_platform.lake.apply import RETRY_FIRST_S, TableHealth
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.coverage import OffsetRange, walk
from cdc_platform.model.errors import ChangelogGapError, FatalError, RetriableError
from cdc_platform.model.windows import BatchPlan, batch_key, changelog_partition, is_batch_key, next_batch_ranges

DAY = "2026-11-25T00:00:00Z"


def test_a_batch_writes_to_its_days_partition_and_keys_sort_in_batch_order() -> None:
    assert changelog_partition(batch_key(DAY, 42)) == DAY
    assert changelog_partition("2026-11-25T08:05:00Z") == "2026-11-25T08:05:00Z"  # a window is its own partition
    assert is_batch_key(batch_key(DAY, 1)) and not is_batch_key(DAY)
    assert sorted([batch_key(DAY, 10), batch_key(DAY, 9), batch_key(DAY, 100)]) == [
        batch_key(DAY, 9), batch_key(DAY, 10), batch_key(DAY, 100),
    ]  # fmt: skip


def test_the_next_batch_reads_from_the_frontier_to_the_end_of_each_partition() -> None:
    ranges = next_batch_ranges("t", {0: 10, 1: 5, 2: 7}, {0: (0, 15), 1: (0, 5), 2: (3, 9)}, max_offsets=1000)
    assert ranges == (OffsetRange(0, 10, 15), OffsetRange(2, 7, 9))  # partition 1 has nothing new
    # a partition the frontier does not know (the topic grew) starts at 0
    assert next_batch_ranges("t", {0: 4}, {0: (0, 4), 1: (0, 2)}, 1000) == (OffsetRange(1, 0, 2),)
    assert next_batch_ranges("t", {0: 4}, {0: (0, 4)}, 1000) == ()


def test_a_batch_is_bounded_and_shared_between_partitions() -> None:
    ranges = next_batch_ranges("t", {0: 0, 1: 0}, {0: (0, 5000), 1: (0, 10)}, max_offsets=2000)
    assert ranges == (OffsetRange(0, 0, 1000), OffsetRange(1, 0, 10))
    # batches planned one after another cover every offset once
    frontier: dict[int, int] = {0: 0, 1: 0}
    seen: list[OffsetRange] = []
    while batch := next_batch_ranges("t", frontier, {0: (0, 5000), 1: (0, 10)}, max_offsets=2000):
        seen.extend(batch)
        frontier = walk(frontier, batch).frontier
    assert frontier == {0: 5000, 1: 10} and sum(r.size for r in seen) == 5010


def test_offsets_kafka_no_longer_holds_are_a_hole() -> None:
    with pytest.raises(ChangelogGapError, match=r"partition 1 must continue at offset 3.*rehydrated"):
        next_batch_ranges("t", {0: 0, 1: 3}, {0: (0, 1), 1: (8, 20)}, 1000)


def test_a_batch_plan_is_read_back_and_the_first_planning_wins(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    assert ledger.last_batch("s.p.t") is None
    first = BatchPlan(1, DAY, (OffsetRange(0, 0, 5), OffsetRange(1, 2, 4)))
    ledger.plan_batch("s.p.t", first)
    ledger.plan_batch("s.p.t", BatchPlan(1, DAY, (OffsetRange(0, 0, 9),)))  # a racing apply's plan
    ledger.plan_batch("other.p.t", BatchPlan(7, DAY, (OffsetRange(0, 0, 1),)))
    assert ledger.last_batch("s.p.t") == first
    second = BatchPlan(2, DAY, (OffsetRange(0, 5, 6),))
    ledger.plan_batch("s.p.t", second)
    assert ledger.last_batch("s.p.t") == second
    # recorded as a changelog range set, the batch is covered like a window
    ledger.record_window("s.p.t", second.as_window(reused=False))
    assert ledger.windows("s.p.t") == {second.key: second.as_window(reused=False).ranges}


def test_a_retriable_failure_backs_off_and_a_fatal_one_parks_the_table_until_a_new_generation() -> None:
    health = TableHealth()
    assert health.ready("g1", now=0.0)
    health.failed(RetriableError("broker down"), "g1", now=0.0)
    assert not health.ready("g1", now=RETRY_FIRST_S - 0.1) and health.ready("g1", now=RETRY_FIRST_S)
    health.failed(RetriableError("broker down"), "g1", now=10.0)
    assert not health.ready("g1", now=10.0 + RETRY_FIRST_S) and health.ready("g1", now=10.0 + 2 * RETRY_FIRST_S)
    health.succeeded()
    health.failed(FatalError("incompatible schema"), "g1", now=0.0)
    assert not health.ready("g1", now=1e9)  # parked, however long
    assert health.ready("g2", now=0.0) and health.error is None  # a new generation: tried again


def _config(tmp_path: Path, apply: str) -> Path:
    path = tmp_path / "cdc_platform.yaml"
    path.write_text(
        f"""
sources:
  shop:
    database: shop
    user: u
    password_env: PW
{apply}
kafka: {{bootstrap_servers: "127.0.0.1:9092"}}
lake: {{root: lake}}
tables:
  - name: shop.public.orders
"""
    )
    return path


def test_the_apply_engine_is_chosen_per_source(tmp_path: Path) -> None:
    windows = load_config(_config(tmp_path, ""))
    assert not windows.streamed(windows.tables[0])
    streamed = load_config(_config(tmp_path, "    apply: {engine: stream, trigger_interval_s: 0.5}"))
    assert streamed.streamed(streamed.tables[0]) and streamed.sources["shop"].apply.trigger_interval_s == 0.5
    with pytest.raises(ConfigError, match=r"sources\.shop\.apply\.engine.*'windows' or 'stream'"):
        load_config(_config(tmp_path, "    apply: {engine: spark}"))


def test_a_crash_point_ends_the_process_only_where_it_is_named() -> None:
    code = (
        "from cdc_platform.lake.crash_points import crash_point as c; "
        "c('apply.planned'); print('past', flush=True); c('{}')"
    )
    env = {"CDC_FAULT_EXIT_AT": "apply.recorded", "PATH": ""}

    def run(point: str) -> tuple[int, bytes]:
        done = subprocess.run([sys.executable, "-c", code.format(point)], env=env, capture_output=True, check=False)
        return done.returncode, done.stdout

    assert run("apply.recorded") == (137, b"past\n")  # like SIGKILL: nothing after it
    assert run("current.merged") == (0, b"past\n")


def test_a_running_apply_reports_current_to_dagster_at_most_once_a_minute(tmp_path: Path) -> None:
    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    now = [0.0]
    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0])

        def applied(changes: int, rebuilt: bool = False) -> list[TableApplied]:
            result = CurrentResult("g1", rebuilt, changes, 10, {0: 5}, 123, None, 0.1)
            return [TableApplied(table.key, batch="b", current=result)]

        def events() -> list[Any]:
            records = instance.fetch_materializations(dg.AssetKey(["shop", "orders"]), limit=100).records
            return [r.asset_materialization for r in records]

        report(applied(3))
        for second in range(1, 60):  # a micro-batch a second: folded into the next report
            now[0] = float(second)
            report(applied(2))
        assert len(events()) == 1
        now[0] = 60.0
        report(applied(2))
        assert len(events()) == 2
        newest = events()[0]
        assert newest is not None and newest.metadata["changes_applied"].value == 2 * 60
        assert newest.metadata["engine"].value == "stream" and newest.metadata["last_applied_lsn"].value == "123"
        now[0] = 61.0
        report(applied(0, rebuilt=True))  # a new generation is shown at once
        assert len(events()) == 3
