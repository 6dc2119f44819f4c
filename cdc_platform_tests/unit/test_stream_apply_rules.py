"""The stream apply's pure rules: batch keys and partitions, the next batch's offsets, its
plan in the ledger, a table's health, the config block, and the crash points."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.config import ConfigError, load_config
from cdc_platform.lake.apply import RETRY_FIRST_S, TableHealth, continues
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.coverage import OffsetRange, walk
from cdc_platform.model.errors import ChangelogGapError, FatalError, RetriableError
from cdc_platform.model.windows import BatchPlan, batch_key, changelog_partition, is_batch_key, next_batch_ranges
from cdc_platform.orchestration.keys import DAY_CHECK

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


def test_a_pending_batch_is_re_applied_only_where_it_continues_the_frontier() -> None:
    """A batch planned before a new generation (whose watermark is past it) is abandoned:
    re-reading it would read offsets the generation holds, or ones retention deleted."""
    plan = BatchPlan(7, "2026-11-25T00:00:00Z", (OffsetRange(0, 10, 20), OffsetRange(2, 0, 5)))
    assert continues({0: 10}, plan)  # partition 2 never read: it stands at 0
    assert continues({0: 10, 1: 4, 2: 0}, plan)
    assert not continues({0: 15}, plan)  # a new generation's watermark inside the batch
    assert not continues({0: 30, 2: 9}, plan)  # past it


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
    default = load_config(_config(tmp_path, ""))
    assert default.streamed(default.tables[0])  # the stream apply, unless a source says windows
    windows = load_config(_config(tmp_path, "    apply: {engine: windows}"))
    assert not windows.streamed(windows.tables[0])
    streamed = load_config(_config(tmp_path, "    apply: {engine: stream, trigger_interval_s: 0.5}"))
    assert streamed.streamed(streamed.tables[0]) and streamed.sources["shop"].apply.trigger_interval_s == 0.5
    with pytest.raises(ConfigError, match=r"sources\.shop\.apply\.engine.*'windows' or 'stream'"):
        load_config(_config(tmp_path, "    apply: {engine: spark}"))


def test_records_are_decoded_in_the_jvm_unless_the_kafka_client_needs_librdkafka_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_platform.lake.changelog import decodes_in_jvm
    from cdc_platform.lake.tables import lake_table

    def decoder(apply: str, kafka_options: str = "") -> bool:
        text = _config(tmp_path, apply).read_text()
        if kafka_options:
            text = text.replace('kafka: {bootstrap_servers: "127.0.0.1:9092"}', kafka_options)
        (tmp_path / "cdc_platform.yaml").write_text(text)
        config = load_config(tmp_path / "cdc_platform.yaml")
        return decodes_in_jvm(lake_table(config, config.tables[0]), config.kafka)

    kafka = 'kafka: {bootstrap_servers: "127.0.0.1:9092", '
    tls = kafka + "options: {security.protocol: ssl, ssl.ca.location: /etc/kafka/ca.pem}}"
    mtls = kafka + "options: {security.protocol: ssl, ssl.certificate.location: /c.pem, ssl.key.location: /k.pem}}"
    scram = (
        kafka + "options: {security.protocol: sasl_ssl, sasl.mechanism: SCRAM-SHA-512, sasl.username: cdc}, "
        "secret_options_env: {sasl.password: TEST_KAFKA_PW}}"
    )
    monkeypatch.setenv("TEST_KAFKA_PW", "plain-pw")
    assert decoder("") and decoder("    apply: {decoder: jvm}") and not decoder("    apply: {decoder: python}")
    assert decoder("", tls) and decoder("", scram) and decoder("    apply: {decoder: jvm}", scram)
    assert not decoder("", mtls)
    with pytest.raises(FatalError, match=r"shop: apply.decoder is jvm, but kafka sets \['ssl.certificate.location'"):
        decoder("    apply: {decoder: jvm}", mtls)
    monkeypatch.setenv("TEST_KAFKA_PW", 'pw"with-a-quote')
    assert not decoder("", scram)
    with pytest.raises(FatalError, match=r"the secret in \$TEST_KAFKA_PW holds a double quote") as refused:
        decoder("    apply: {decoder: jvm}", scram)
    assert "with-a-quote" not in str(refused.value)


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
            records = instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=100).records
            return [r.asset_observation for r in records]

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


def test_the_vacuums_of_old_files_since_the_last_report_are_shown_on_current(tmp_path: Path) -> None:
    """A VACUUM runs after a batch (hourly by default) while reports are throttled to one a
    minute: what it deleted must reach current's next report, summed over the VACUUMs since
    the last one, and a failure must show there (it is otherwise only in the apply's log)."""
    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.maintenance import Vacuumed
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    now = [0.0]

    def applied(vacuumed: Vacuumed | None = None) -> list[TableApplied]:
        result = CurrentResult("g1", False, 1, 10, {0: 5}, 123, None, 0.1)
        return [TableApplied(table.key, batch="b", current=result, vacuumed=vacuumed)]

    def newest() -> Any:
        records = instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=1).records
        return records[0].asset_observation.metadata

    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0])
        report(applied())
        assert "old_files_deleted" not in newest()  # no VACUUM since: nothing claimed
        now[0] = 10.0
        report(applied(Vacuumed(table.key, 7, 0.25, ("current: OSError: disk",))))  # throttled, not lost
        now[0] = 20.0
        report(applied(Vacuumed(table.key, 5, 0.5)))
        now[0] = 60.0
        report(applied())
        shown = newest()
        assert shown["old_files_deleted"].value == 12 and shown["vacuum_s"].value == 0.75
        assert "vacuum_failed" not in shown  # the later VACUUM succeeded
        now[0] = 120.0
        report(applied(Vacuumed(table.key, 0, 0.1, ("current: OSError: disk",))))
        assert "OSError: disk" in newest()["vacuum_failed"].value
        now[0] = 180.0
        report.report_run(applied(Vacuumed(table.key, 3, 0.1)) + applied(Vacuumed(table.key, 4, 0.1)))
        assert newest()["old_files_deleted"].value == 7  # a scheduled run: its VACUUMs summed


def test_a_batch_too_big_for_the_driver_shows_on_current_in_the_ui(tmp_path: Path) -> None:
    """A table whose batch was too big for the driver applies through Spark for a while,
    slower: current's next report counts the refusals since the last one (0 otherwise, so
    the UI plots it) and says the table's batches go through Spark while they do. Only the
    apply's log said so before."""
    import dagster as dg

    from cdc_platform.lake import driver_batch
    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    now = [0.0]
    applied = [TableApplied(table.key, batch="b", current=CurrentResult("g1", False, 1, 10, {0: 5}, 123, None, 0.1))]

    def newest() -> Any:
        records = instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=1).records
        return records[0].asset_observation.metadata

    refused = RuntimeError("Total size of serialized results of 1 tasks (16.2 MiB) is bigger than "
                           "spark.driver.maxResultSize (4.0 MiB)")  # fmt: skip
    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0])
        report(applied)
        assert newest()["too_big_for_driver"].value == 0 and "batches_through" not in newest()
        driver_batch.too_big(table, "a batch of 1000 records", refused)
        driver_batch.too_big(table, "a batch of 1000 records", refused)
        now[0] = 60.0
        report(applied)
        assert newest()["too_big_for_driver"].value == 2
        assert "too big for the driver" in newest()["batches_through"].value
        now[0] = 120.0
        report(applied)
        assert newest()["too_big_for_driver"].value == 0  # since the last report
        driver_batch._too_big.clear()  # the time-to-live over: back on the driver
        now[0] = 180.0
        report(applied)
        assert "batches_through" not in newest()


def test_the_apply_observes_current_and_reports_its_fresh_check(tmp_path: Path) -> None:
    """Current is observed, never materialized, by the apply: Dagster counts a check's
    result only for the materialization it followed, and materializations every minute hid
    every result of the 10-minute check runs. What the apply says about current's lag is the
    ``fresh`` check: failing while an hour behind, passing again as soon as it is back."""
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    key, now = dg.AssetKey(["shop", "orders"]), [0.0]

    def applied(behind_s: float, offsets_behind: int) -> list[TableApplied]:
        newest_change = datetime.now(UTC) - timedelta(seconds=behind_s)
        result = CurrentResult("g1", False, 50, 10, {0: 5}, 123, newest_change, 0.1)
        eta = offsets_behind / 1000  # the table's rate: 1 000 offsets a second
        return [TableApplied(table.key, batch="b", current=result, offsets_behind=offsets_behind, catch_up_eta_s=eta)]

    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0])
        for minute in range(3):  # catching up a backlog, an hour behind
            now[0] = 60.0 * minute
            report(applied(3600 - 60 * minute, offsets_behind=50_000))
        observed = instance.fetch_observations(key, limit=10).records
        assert len(observed) == 3 and instance.fetch_materializations(key, limit=10).records == []
        checks = _fresh_checks(instance, key)
        assert [c.passed for c in checks] == [False, False, False]
        assert checks[0].metadata["freshness_lag_s"].value >= 3480
        newest = checks[0].metadata
        assert (newest["offsets_behind"].value, newest["catch_up_eta_s"].value) == (50_000, 50.0)
        assert "behind the source (50000 offset(s) not applied)" in str(checks[0].description)
        assert "cdc-platform apply --source shop" in str(checks[0].description)
        assert "sources.shop.apply.schedule" in str(checks[0].description)  # or no long-running Spark
        now[0] = 130.0  # within seconds of the source again: shown at once, not a throttle period later
        report(applied(8, offsets_behind=40))
        assert [c.passed for c in _fresh_checks(instance, key)][:2] == [True, False]
        now[0] = 140.0
        report(applied(3, offsets_behind=2))  # fresh, and throttled as before
        assert len(_fresh_checks(instance, key)) == 4 and instance.fetch_materializations(key, limit=10).records == []


def test_fresh_fails_when_changes_waited_longer_than_allowed_though_each_batch_ends_close(tmp_path: Path) -> None:
    """A batch's end is when current is closest to the source (its newest change's wait);
    just before it committed, current lagged by its oldest change's wait. Batches that end
    3 s behind but hold changes that waited 90 s for them are not fresh within 60 s: the
    check read only the first figure and stayed green."""
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.changelog import WindowResult
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    key, now = dg.AssetKey(["shop", "orders"]), [0.0]

    def batch(oldest_waited_s: float) -> list[TableApplied]:
        at = datetime.now(UTC)
        result = CurrentResult("g1", False, 50, 10, {0: 5}, 123, at - timedelta(seconds=3), 0.1)
        changelog = WindowResult("d", [], False, {"u": 50})
        oldest = at - timedelta(seconds=oldest_waited_s)
        return [
            TableApplied(
                table.key, batch=f"{DAY}#1", changelog=changelog, current=result, offsets_behind=0,
                oldest_change_ts=oldest,
            )
        ]  # fmt: skip

    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0])
        report(batch(20))
        assert [c.passed for c in _fresh_checks(instance, key)] == [True]
        now[0] = 20.0
        report(batch(90))  # throttled: folded into the next report, not forgotten
        now[0] = 61.0
        report(batch(30))
        newest = _fresh_checks(instance, key)[0]
        assert not newest.passed and newest.metadata["longest_wait_s"].value >= 90
        assert newest.metadata["freshness_lag_s"].value == 0.0  # caught up at the batch's end: not what failed
        assert "a change reached current 90 s after its commit, more than 60 s" in str(newest.description)
        observed = instance.fetch_observations(key, limit=1).records[0].asset_observation
        assert observed is not None and observed.metadata["longest_wait_s"].value >= 90
        now[0] = 70.0  # its next batch within reach again: green at once, not a throttle period later
        report(batch(12))
        assert [c.passed for c in _fresh_checks(instance, key)][:2] == [True, False]


def test_a_table_that_may_lag_sets_its_own_fresh_threshold(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.keys import FRESH_CHECK
    from cdc_platform.orchestration.reporting import RunlessReporter

    text = _config(tmp_path, "    apply: {engine: stream}").read_text()
    verdicts = []
    for checks in ("", "    checks: {fresh_within_s: 600}\n"):
        (tmp_path / "cdc_platform.yaml").write_text(text + checks)
        config = load_config(tmp_path / "cdc_platform.yaml")
        table = lake_table(config, config.tables[0])
        five_minutes_ago = datetime.now(UTC) - timedelta(minutes=5)
        result = CurrentResult("g1", False, 50, 10, {0: 5}, 123, five_minutes_ago, 0.1)
        with dg.DagsterInstance.ephemeral() as instance:
            RunlessReporter(instance, [table], position=str)(
                [TableApplied(table.key, batch="b", current=result, offsets_behind=900)]
            )
            [record] = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(["shop", "orders"]), FRESH_CHECK), limit=10
            )
            assert record.event is not None and record.event.asset_check_evaluation is not None
            check = record.event.asset_check_evaluation
            verdicts.append((check.passed, check.metadata["fresh_within_s"].value))
    assert verdicts == [(False, 60.0), (True, 600.0)]  # five minutes behind: late by default, fresh at 10 minutes


@pytest.mark.parametrize(
    ("silent_s", "fresh_within_s", "fresh"),
    [(300.0, 60.0, False), (25.0, 60.0, True), (300.0, 600.0, True), (45.0, 40.0, False)],
    ids=["capture silent 5 min", "between heartbeats", "silent within the table's threshold", "just over"],
)
def test_a_table_caught_up_with_kafka_is_not_fresh_while_capture_is_silent(
    tmp_path: Path, silent_s: float, fresh_within_s: float, fresh: bool
) -> None:
    """Caught up with Kafka is not caught up with the source when nothing puts the source's
    changes in Kafka: a capture that died left every table "0 s behind" and the fresh check
    green for as long as it stayed down. Its silence counts once no running capture would be
    that silent (three heartbeats: 30 s), and the check says what to start."""
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter
    from cdc_platform.sources.base import CaptureSilence

    text = _config(tmp_path, "    apply: {engine: stream}").read_text()
    (tmp_path / "cdc_platform.yaml").write_text(text + f"    checks: {{fresh_within_s: {fresh_within_s}}}\n")
    config = load_config(tmp_path / "cdc_platform.yaml")
    table = lake_table(config, config.tables[0])
    silence = CaptureSilence(silent_s, 30.0, "is capture running? start it: cdc-platform capture run --source shop")
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)  # its newest change: the table is quiet
    result = CurrentResult("g1", False, 0, 10, {0: 5}, 123, an_hour_ago, 0.1)
    with dg.DagsterInstance.ephemeral() as instance:
        reporter = RunlessReporter(instance, [table], position=str, capture=lambda _table: silence)
        reporter([TableApplied(table.key, current=result, offsets_behind=0)])  # caught up with Kafka
        [check] = _fresh_checks(instance, dg.AssetKey(["shop", "orders"]))
        observed = instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=1).records
    assert check.passed is fresh
    assert check.metadata["capture_silent_s"].value == silent_s
    lag = check.metadata["freshness_lag_s"].value
    assert lag == (silent_s if silent_s > 30 else 0.0)  # the table's lag, as current's observation plots it
    assert observed[0].asset_observation.metadata["freshness_lag_s"].value == lag
    if not fresh:
        assert check.description is not None
        assert f"capture of source 'shop' has shown no sign of reading the source for {silent_s:.0f} s" in (
            check.description
        )
        assert "start it: cdc-platform capture run --source shop" in check.description
    without = _fresh_check_without_capture_known(tmp_path, result)
    assert without  # a source that cannot tell (no heartbeats): the check goes by Kafka, as before


def _fresh_check_without_capture_known(tmp_path: Path, result: Any) -> bool:
    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(tmp_path / "cdc_platform.yaml")
    table = lake_table(config, config.tables[0])
    with dg.DagsterInstance.ephemeral() as instance:
        RunlessReporter(instance, [table], position=str)([TableApplied(table.key, current=result, offsets_behind=0)])
        [check] = _fresh_checks(instance, dg.AssetKey(["shop", "orders"]))
    return bool(check.passed)


def test_capture_is_asked_once_per_interval_and_a_source_out_of_reach_is_no_verdict(tmp_path: Path) -> None:
    """A stream apply reports hundreds of tables: a source's capture (its newest heartbeat,
    or the poller's cursors) is asked at most every few seconds, once for all its tables,
    and a source that cannot be asked leaves the check to Kafka rather than failing the
    report."""
    from cdc_platform.sources.base import CaptureSilence, CaptureWatch

    text = _config(tmp_path, "    apply: {engine: stream}").read_text()
    config = load_config(_write(tmp_path, text + "  - name: shop.public.lines\n"))
    orders, lines = config.tables
    asked: list[int] = []
    answers: list[dict[str, CaptureSilence] | Exception] = [
        {orders.key: CaptureSilence(1.0, 30.0, "")},  # lines: nothing to go by
        OSError("broker down"),
    ]

    class Asked:
        def capture_silences(self) -> dict[str, CaptureSilence]:
            asked.append(1)
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    now = [0.0]
    watch = CaptureWatch({"shop": Asked()}, every_s=5.0, clock=lambda: now[0])  # type: ignore[dict-item]
    first = watch(orders)
    now[0] = 4.9
    assert watch(orders) is first and first is not None and watch(lines) is None
    assert len(asked) == 1  # within 5 s, for every table of the source: one ask
    now[0] = 5.1
    assert watch(orders) is None and len(asked) == 2  # asked again; out of reach: no verdict


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdc_platform.yaml"
    path.write_text(text)
    return path


def test_a_debezium_connectors_heartbeats_are_its_sign_of_life_when_it_sends_them(tmp_path: Path) -> None:
    from cdc_platform.sources import open_source
    from cdc_platform.sources.postgres.producer import heartbeat_every_s

    def every_s(producer: str) -> float | None:
        text = _config(tmp_path, f"    heartbeat_interval_s: 4\n{producer}").read_text()
        (tmp_path / "cdc_platform.yaml").write_text(
            text.replace('"127.0.0.1:9092"', '"127.0.0.1:9092", cleanup_policy: delete')
        )
        config = load_config(tmp_path / "cdc_platform.yaml")
        return heartbeat_every_s(open_source(config, "shop").endpoint)  # type: ignore[attr-defined]

    assert every_s("") == 4.0  # the platform's capture
    required = "interval.handling.mode: string, snapshot.mode: no_data, skipped.operations: none, plugin.name: pgoutput"
    debezium = "    producer: {kind: debezium, connector: shop-cdc, settings: {%s}}"
    assert every_s(debezium % required) is None  # Debezium's default: no heartbeats, nothing to go by
    assert every_s(debezium % f"{required}, heartbeat.interval.ms: '10000'") == 10.0


def test_a_backlog_is_logged_with_what_is_left_and_when_it_is_done() -> None:
    from datetime import UTC, datetime, timedelta

    from cdc_platform.lake.apply import TableApplied, catch_up_eta_s, describe
    from cdc_platform.lake.current import CurrentResult

    # 20 000 offsets in the 8 s since the table's previous batch: 2 500/s, so 150 000 left take 60 s
    assert catch_up_eta_s(150_000, 20_000, 8.0) == 60.0
    assert catch_up_eta_s(None, 20_000, 8.0) is None and catch_up_eta_s(5, 0, 8.0) is None
    newest = datetime.now(UTC) - timedelta(minutes=20)
    result = CurrentResult("g1", False, 20_000, 10, {0: 5}, 123, newest, 3.0)
    line = describe(TableApplied("s.p.t", current=result, offsets_behind=150_000, catch_up_eta_s=60.0))
    assert line.endswith("s behind the source; 150000 offsets to apply, about 60 s [0.00 s]"), line
    caught_up = describe(TableApplied("s.p.t", current=result, offsets_behind=0))
    assert "offsets to apply" not in caught_up


def test_a_batch_logs_its_newest_and_its_oldest_changes_wait() -> None:
    """The log's "behind the source" is the newest change's wait at the batch's end, the least of the
    batch's; a change committed just after the previous batch began waited that batch and
    this one. The line gives both, so commit -> current is read from the log, not guessed."""
    from datetime import UTC, datetime, timedelta

    from cdc_platform.lake.apply import TableApplied, describe
    from cdc_platform.lake.changelog import WindowResult
    from cdc_platform.lake.current import CurrentResult

    now = datetime.now(UTC)
    result = CurrentResult("g1", False, 40, 10, {0: 5}, 123, now - timedelta(seconds=3), 3.0)
    changelog = WindowResult("2026-11-29", [], False, {"u": 40})
    oldest = now - timedelta(seconds=41)
    line = describe(
        TableApplied("s.p.t", batch="b7", offsets=40, changelog=changelog, current=result, oldest_change_ts=oldest)
    )
    match = re.search(r", ([\d.]+) s behind the source, oldest change ([\d.]+) s after its commit", line)
    assert match is not None, line
    assert 3.0 <= float(match[1]) < 4.0 and 41.0 <= float(match[2]) < 42.0
    assert "oldest change" not in describe(TableApplied("s.p.t", current=result))  # no batch, nothing to say


def _fresh_checks(instance: Any, key: Any) -> list[Any]:
    """The ``fresh`` check evaluations of ``key`` in ``instance``, newest first."""
    import dagster as dg

    from cdc_platform.orchestration.keys import FRESH_CHECK

    records = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(key, FRESH_CHECK), limit=10)
    return [r.event.asset_check_evaluation for r in records if r.event is not None]


def _lease(holder: str, state: str, at_s: float, host: str = "h1", pid: int = 1) -> Any:
    from datetime import UTC, datetime, timedelta

    from cdc_platform.model.leases import LeaseEvent, LeaseState

    return LeaseEvent(
        "apply:shop", holder, host, pid, LeaseState(state), datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=at_s)
    )


def test_a_source_is_applied_by_the_first_live_holder_only() -> None:
    from datetime import UTC, datetime, timedelta

    from cdc_platform.model.leases import live_holders

    now = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=100)
    this_host = {1: True, 2: False, 3: True}
    asked: list[tuple[int, datetime]] = []

    def alive(host: str, pid: int, taken: datetime) -> bool | None:
        asked.append((pid, taken))
        return this_host[pid] if host == "h1" else None  # another host: only its heartbeat tells

    events = [_lease("a", "held", 10, pid=1), _lease("b", "held", 5, pid=2), _lease("c", "held", 20, pid=3)]
    # b took it first but its process is gone (SIGKILL): a holds it, c is refused
    assert [h.holder for h in live_holders(events, now, alive, ttl_s=60)] == ["a", "c"]
    # asked with when each took the lease (its first row): a pid reused since is not the holder
    assert sorted(asked) == sorted((e.pid, e.at) for e in events)
    renewed = [*events, _lease("a", "held", 40, pid=1)]
    asked.clear()
    live_holders(renewed, now, alive, ttl_s=60)
    assert (1, events[0].at) in asked
    # a released it: c now holds it
    assert [h.holder for h in live_holders([*events, _lease("a", "released", 30, pid=1)], now, alive, 60)] == ["c"]
    # on another host, a holder lives as long as its heartbeats are younger than the TTL
    remote = [_lease("r", "held", 0, host="h2", pid=9), _lease("r", "held", 50, host="h2", pid=9)]
    assert [h.holder for h in live_holders(remote, now, alive, ttl_s=60)] == ["r"]
    assert live_holders(remote, now + timedelta(seconds=11), alive, ttl_s=60) == []
    assert live_holders(remote, now, alive, ttl_s=60)[0].since == remote[0].at  # the first taker's time


def test_a_second_apply_of_a_source_stops_with_the_holder_named(tmp_path: Path) -> None:
    from cdc_platform.lake.apply import ApplyLease

    ledger = Ledger(str(tmp_path))
    first = ApplyLease(ledger, ["apply:shop"])
    first.acquire()
    second = ApplyLease(ledger, ["apply:shop"])
    with pytest.raises(FatalError, match=r"source 'shop' is already applied by another process \(pid \d+ on ") as err:
        second.acquire()
    assert err.value.reason == "apply_already_running" and not second.held
    other_source = ApplyLease(ledger, ["apply:crm"])
    other_source.acquire()  # one lease per source, not per lake
    first.release()
    second.acquire()  # released: the next one takes it at once
    assert second.held


def test_the_lease_of_a_killed_apply_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    from cdc_platform.lake.apply import ApplyLease

    ledger = Ledger(str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = ApplyLease(ledger, ["apply:shop"])
    killed.pid = dead.pid  # what a SIGKILLed apply leaves behind: held, by a process that is gone
    killed.acquire()
    successor = ApplyLease(ledger, ["apply:shop"])
    successor.acquire()
    assert successor.held


def test_the_lease_of_a_killed_apply_whose_pid_another_process_got_is_taken_over(tmp_path: Path) -> None:
    """Seen in the fault suite: an apply SIGKILLed, its pid then given by the kernel to some
    other process (the test run starts hundreds), and every restart of the apply refused for
    minutes ("already applied by another process (pid N, last heard of 630 s ago)"). A
    process that started after the holder took the lease cannot be the holder."""
    import socket
    import uuid
    from datetime import UTC, datetime, timedelta

    from cdc_platform.lake.apply import ApplyLease
    from cdc_platform.model.leases import LeaseEvent, LeaseState

    ledger = Ledger(str(tmp_path))
    host = socket.gethostname()
    reuser = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        taken = datetime.now(UTC) - timedelta(seconds=60)  # the killed apply took the lease a minute ago
        ledger.record_lease(LeaseEvent("apply:shop", f"{host}:{reuser.pid}:dead", host, reuser.pid,
                                       LeaseState.HELD, taken))  # fmt: skip
        successor = ApplyLease(ledger, ["apply:shop"])
        successor.acquire()
        assert successor.held
        successor.release()
        # the same pid holding a lease it took after it started is a live apply: refused
        ledger.record_lease(LeaseEvent("apply:shop", f"{host}:{reuser.pid}:{uuid.uuid4().hex[:8]}", host,
                                       reuser.pid, LeaseState.HELD, datetime.now(UTC)))  # fmt: skip
        with pytest.raises(FatalError, match=rf"pid {reuser.pid} on "):
            ApplyLease(ledger, ["apply:shop"]).acquire()
    finally:
        reuser.kill()
        reuser.wait()


def test_a_running_apply_reports_each_changelog_day_and_seals_it_and_idle_tables_stay_fresh(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.changelog import ChangelogDay, WindowResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.model.state import CurrentPosition
    from cdc_platform.model.windows import WindowRange
    from cdc_platform.orchestration.reporting import RunlessReporter

    config = load_config(_config(tmp_path, "    apply: {engine: stream}"))
    table = lake_table(config, config.tables[0])
    changelog = dg.AssetKey(["shop", "orders", "changelog"])
    now = [0.0]
    old_change = datetime.now(UTC) - timedelta(hours=3)
    idle = {table.key: (CurrentPosition("g1", {0: 12}, 99, old_change, 7), 0)}  # caught up long ago

    def batch(number: int, start: int, end: int, day: str = DAY) -> list[TableApplied]:
        ranges = [WindowRange(0, start, end, "")]
        result = WindowResult(batch_key(day, number), ranges, False, {"u": end - start, "d": 1}, dead_letters=1)
        return [TableApplied(table.key, batch=batch_key(day, number), changelog=result)]

    def days() -> list[Any]:
        records = instance.fetch_materializations(changelog, limit=100).records
        return [r.asset_materialization for r in records]

    with dg.DagsterInstance.ephemeral() as instance:
        report = RunlessReporter(instance, [table], position=str, clock=lambda: now[0], positions=lambda: idle)
        report(batch(1, 0, 5))  # a day's first batch creates its partition and is shown at once
        now[0] = 10.0
        report(batch(2, 5, 9))
        assert len(days()) == 1 and instance.get_dynamic_partitions("shop_orders_changelog_days") == ["2026-11-25"]
        now[0] = 60.0
        report(batch(3, 9, 12))
        newest = days()[0]
        assert newest is not None and newest.partition == "2026-11-25"
        assert newest.metadata["batches"].value == 3 and newest.metadata["offset_ranges"].value == {"0": [0, 12]}
        assert newest.metadata["events_u"].value == 12 and newest.metadata["dead_letters"].value == 3
        assert newest.metadata["sealed"].value is False
        # the next UTC day: the apply sealed this one (whole day, checked contiguous) and is filling the next
        sealed = ChangelogDay(
            table.key, DAY, 3, {0: (0, 12)}, {"u": 12, "d": 3}, 3, sealed=True, records_written=18, records_held=18
        )
        now[0] = 61.0
        report([TableApplied(table.key, sealed=sealed), *batch(4, 12, 13, day="2026-11-26T00:00:00Z")])
        sealed_event, next_day = days()[1], days()[0]
        assert sealed_event is not None and sealed_event.metadata["sealed"].value is True
        assert sealed_event.metadata["contiguous"].value is True and sealed_event.partition == "2026-11-25"
        assert next_day is not None and next_day.partition == "2026-11-26"
        # the sealed day's check, on its partition (a day still filling has none yet)
        assert _day_checks(instance, changelog) == [("2026-11-25", True, None)]
        doubled = replace(sealed, day="2026-11-26T00:00:00Z", records_twice=2)
        report([TableApplied(table.key, sealed=doubled)])
        failed = _day_checks(instance, changelog)[0]
        assert failed[:2] == ("2026-11-26", False) and "2 record(s) twice" in str(failed[2])
        assert "dropDuplicates on kafka_partition, kafka_offset" in str(failed[2])
        # a record its batches wrote, gone from the changelog: the day fails (it passed while the records were gone)
        lost = replace(sealed, day="2026-11-27T00:00:00Z", records_held=17)
        report([TableApplied(table.key, sealed=lost)])
        failed = _day_checks(instance, changelog)[0]
        assert failed[:2] == ("2026-11-27", False) and "1 record(s) its batches wrote no longer in it" in str(failed[2])
        assert "RESTORE" in str(failed[2])
        # a day with batches recorded before counts were kept: not verified, so not green
        uncounted = replace(sealed, day="2026-11-28T00:00:00Z", records_written=None)
        report([TableApplied(table.key, sealed=uncounted)])
        warned = _day_checks(instance, changelog)[0]
        assert warned[:2] == ("2026-11-28", False) and "not counted back" in str(warned[2])
        # a table with nothing to apply is reported every two minutes, caught up: not stale
        now[0] = 400.0
        report([])
        current = instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=10).records
        assert len(current) == 1
        metadata = current[0].asset_observation.metadata  # type: ignore[union-attr]
        assert metadata["offsets_behind"].value == 0 and metadata["freshness_lag_s"].value == 0.0
        assert metadata["rows"].value == 7
        now[0] = 500.0
        report([])
        assert len(instance.fetch_observations(dg.AssetKey(["shop", "orders"]), limit=10).records) == 1


def test_an_hourly_changelog_is_planned_reported_and_checked_by_the_hour(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    import dagster as dg

    from cdc_platform.lake.apply import TableApplied, stream_partition_now
    from cdc_platform.lake.changelog import WindowResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.model.windows import WindowRange
    from cdc_platform.orchestration.partitions import changelog_days_partitions, day_partition_key, day_window_key
    from cdc_platform.orchestration.reporting import RunlessReporter

    text = _config(tmp_path, "    apply: {engine: stream}").read_text()
    (tmp_path / "cdc_platform.yaml").write_text(text + "    changelog: {partition: hour}\n")
    config = load_config(tmp_path / "cdc_platform.yaml")
    table = lake_table(config, config.tables[0])
    now = datetime.now(UTC)
    assert stream_partition_now(table) == now.strftime("%Y-%m-%dT%H:00:00Z")  # batches planned now write here
    hour = "2026-11-25T13:00:00Z"
    assert day_partition_key(table.config, hour) == "2026-11-25-13:00"
    assert day_window_key("2026-11-25-13:00") == hour and day_window_key("2026-11-25") == DAY
    assert changelog_days_partitions(table.config).name == "shop_orders_changelog_hours"

    result = WindowResult(batch_key(hour, 1), [WindowRange(0, 0, 5, "")], False, {"u": 5})
    with dg.DagsterInstance.ephemeral() as instance:
        RunlessReporter(instance, [table], position=str)(
            [TableApplied(table.key, batch=batch_key(hour, 1), changelog=result)]
        )
        assert instance.get_dynamic_partitions("shop_orders_changelog_hours") == ["2026-11-25-13:00"]
        [record] = instance.fetch_materializations(dg.AssetKey(["shop", "orders", "changelog"]), limit=10).records
        assert record.asset_materialization is not None and record.asset_materialization.partition == "2026-11-25-13:00"

    windows = text.replace("    apply: {engine: stream}\n", "    apply: {engine: windows}\n")
    (tmp_path / "cdc_platform.yaml").write_text(windows + "    changelog: {partition: hour}\n")
    with pytest.raises(ConfigError, match=r"changelog\.partition: .*applied by changelog-window runs.*engine: stream"):
        load_config(tmp_path / "cdc_platform.yaml")


def _day_checks(instance: Any, changelog: Any) -> list[tuple[str | None, bool, str | None]]:
    """The changelog's day check evaluations, newest first: (partition, passed, description)."""
    import dagster as dg

    records = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(changelog, DAY_CHECK), limit=10
    )
    evaluations = [r.event.asset_check_evaluation for r in records if r.event is not None]
    return [(e.partition, e.passed, e.description) for e in evaluations if e is not None]


def test_one_apply_takes_the_named_streamed_sources_or_all_of_them(tmp_path: Path) -> None:
    from cdc_platform.cli.apply import streamed_sources
    from cdc_platform.cli.main import CliError

    path = tmp_path / "cdc_platform.yaml"
    path.write_text(
        """
sources:
  shop: {database: shop, user: u, password_env: PW, apply: {engine: stream}}
  bench: {database: bench, user: u, password_env: PW, apply: {engine: stream}}
  old: {database: old, user: u, password_env: PW, apply: {engine: windows}}
kafka: {bootstrap_servers: "127.0.0.1:9092"}
lake: {root: lake}
tables: [{name: shop.public.a}, {name: bench.public.b}, {name: old.public.c}]
"""
    )
    config = load_config(path)
    assert streamed_sources(config, ["shop", "bench"], False) == ["shop", "bench"]
    assert streamed_sources(config, None, True) == ["shop", "bench"]  # --all: the streamed ones
    with pytest.raises(CliError, match=r"'old' is applied by changelog-window runs.*sources\.old\.apply\.engine"):
        streamed_sources(config, ["old"], False)
    with pytest.raises(CliError, match=r"no source 'nope'"):
        streamed_sources(config, ["nope"], False)
    with pytest.raises(CliError, match=r"--source \(or use --all\)"):
        streamed_sources(config, None, False)


GROUPED = """
sources:
  shop: {database: shop, user: u, password_env: PW, apply: {engine: stream}}
  crm: {database: crm, user: u, password_env: PW, apply: {engine: stream}}
kafka: {bootstrap_servers: "127.0.0.1:9092"}
lake: {root: lake}
tables:
  - {name: shop.public.orders, apply_group: big}
  - {name: shop.public.order_items, apply_group: big}
  - {name: shop.public.customers}
  - {name: crm.crm.accounts}
"""


def test_an_apply_group_is_applied_by_one_process_and_a_whole_source_apply_excludes_its_groups(
    tmp_path: Path,
) -> None:
    from cdc_platform.cli.apply import grouped_tables
    from cdc_platform.cli.main import CliError
    from cdc_platform.lake.apply import ApplyLease
    from cdc_platform.lake.tables import lake_table

    path = tmp_path / "cdc_platform.yaml"
    path.write_text(GROUPED)
    config = load_config(path)

    def lease(sources: list[str], groups: list[str] | None) -> ApplyLease:
        tables = [lake_table(config, t) for t in grouped_tables(config, sources, groups)]
        return ApplyLease(Ledger(str(tmp_path)), [t.apply_scope for t in tables])

    assert [t.key for t in grouped_tables(config, ["shop"], ["big"])] == [
        "shop.public.orders",
        "shop.public.order_items",
    ]
    assert [t.key for t in grouped_tables(config, ["shop"], ["default"])] == ["shop.public.customers"]
    assert len(grouped_tables(config, ["shop"], None)) == 3  # no --group: every group of the source
    with pytest.raises(CliError, match=r"no table of shop is in apply group huge \(its groups: big, default\)"):
        grouped_tables(config, ["shop"], ["huge"])

    big, rest, crm = lease(["shop"], ["big"]), lease(["shop"], ["default"]), lease(["crm"], None)
    for holder in (big, rest, crm):
        holder.acquire()  # groups of one source side by side, and another source
    whole = lease(["shop"], None)
    with pytest.raises(FatalError, match=r"source 'shop' is already applied") as err:
        whole.acquire()  # the whole source would apply the default group's tables a second time
    assert err.value.reason == "apply_already_running" and not whole.held
    rest.release()
    with pytest.raises(FatalError, match=r"source 'shop' \(apply group 'big'\) is already applied"):
        whole.acquire()  # and the big group's
    rest = lease(["shop"], ["default"])
    rest.acquire()  # all or nothing: the refused whole-source apply kept no group it had taken first
    rest.release()
    big.release()
    whole.acquire()
    assert whole.held
    with pytest.raises(FatalError, match=r"apply group 'big'"):
        lease(["shop"], ["big"]).acquire()


def test_an_apply_group_needs_the_stream_engine(tmp_path: Path) -> None:
    path = tmp_path / "cdc_platform.yaml"
    path.write_text(
        GROUPED.replace(
            "crm: {database: crm, user: u, password_env: PW, apply: {engine: stream}}",
            "crm: {database: crm, user: u, password_env: PW, apply: {engine: windows}}",
        ).replace("{name: crm.crm.accounts}", "{name: crm.crm.accounts, apply_group: nightly}")
    )
    with pytest.raises(
        ConfigError,
        match=r"apply group 'nightly', but source 'crm' is applied by changelog-window runs.*engine: stream",
    ):
        load_config(path)
    path.write_text(GROUPED.replace("apply_group: big}", "apply_group: Big}", 1))
    with pytest.raises(ConfigError, match=r"apply_group"):
        load_config(path)


def test_a_scheduled_source_gets_an_apply_job_whose_schedule_never_overlaps_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from cdc_platform.orchestration.definitions import build_definitions

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    path = _config(tmp_path, '    apply: {engine: stream, schedule: "*/5 * * * *"}')
    defs = build_definitions(path)
    job = defs.resolve_job_def("shop__apply_job")
    schedule = defs.resolve_schedule_def("shop__apply_job_schedule")
    assert schedule.cron_schedule == "*/5 * * * *" and schedule.job_name == job.name
    with dg.instance_for_test() as instance:  # a schedule's context needs a persistent instance
        assert isinstance(schedule(dg.build_schedule_context(instance=instance)), dg.RunRequest)
        instance.add_run(dg.DagsterRun(job_name=job.name, run_id="r1", status=dg.DagsterRunStatus.STARTED))
        skipped = schedule(dg.build_schedule_context(instance=instance))
        assert isinstance(skipped, dg.SkipReason) and "r1" in (skipped.skip_message or "")
    # without a schedule the job is there to launch by hand; a windows source has none
    assert build_definitions(_config(tmp_path, "    apply: {engine: stream}")).resolve_job_def("shop__apply_job")
    with pytest.raises(dg.DagsterInvariantViolationError):
        build_definitions(_config(tmp_path, "    apply: {engine: windows}")).resolve_job_def("shop__apply_job")
    with pytest.raises(ConfigError, match=r"sources\.shop\.apply\.schedule"):
        load_config(_config(tmp_path, '    apply: {engine: stream, schedule: "every five minutes"}'))


def test_the_deleted_keys_guard_is_skipped_only_when_every_event_is_newer_than_what_current_applied() -> None:
    """A remembered delete is at or before current's applied position, so a batch whose
    oldest event is after it holds no stale duplicate; anything else is checked."""
    from cdc_platform.lake.current import BatchSummary

    assert BatchSummary(10, max_commit=900, min_commit=501).newer_than(500)
    assert not BatchSummary(10, max_commit=900, min_commit=500).newer_than(500)  # the same commit: checked
    assert not BatchSummary(10, max_commit=900, min_commit=120).newer_than(500)  # a re-delivered event
    assert not BatchSummary(10, max_commit=900, min_commit=None).newer_than(500)
    assert not BatchSummary(10, max_commit=900, min_commit=501).newer_than(None)  # no position known


def test_a_tables_next_batch_waits_out_the_idle_pause_and_the_minimum_interval() -> None:
    from cdc_platform.model.windows import next_batch_due

    assert next_batch_due(None, None, 30.0) == 0.0  # never applied: at once
    assert next_batch_due(None, 100.0, 0.0) == 100.0  # no minimum: as soon as the last one is done
    assert next_batch_due(None, 100.0, 30.0) == 130.0  # 30 s after the last batch started, however short it was
    assert next_batch_due(105.0, 100.0, 30.0) == 130.0  # idle and spaced: the later of the two
    assert next_batch_due(140.0, 100.0, 30.0) == 140.0


class AskedKafka:
    """Kafka's watermarks as a stream apply asks for them: each topic's own (partition 0 at
    ``len(topic)``), every question recorded; ``down`` makes every question fail."""

    def __init__(self) -> None:
        self.questions: list[list[str]] = []
        self.down = False

    def watermarks_of(self, topics: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
        self.questions.append(list(topics))
        if self.down:
            raise RetriableError("Kafka at 127.0.0.1:9 did not answer (offsets): down")
        return {t: {0: (0, len(t))} for t in topics}


def test_tables_due_together_share_one_watermark_question_and_get_their_own_topics(tmp_path: Path) -> None:
    """With hundreds of tables, one Kafka question per table per pass kept the pool's
    threads waiting on Kafka (~70 ms each with a fresh client) while a busy table's batch
    queued behind them; one question for every table due at that moment, each table given
    its own topic's answer. If that question fails, each table asks on its own (None) and
    its failure stays its own."""
    import threading

    from cdc_platform.lake.apply import StreamApply, TableApplied
    from cdc_platform.lake.tables import lake_table

    text = _config(tmp_path, "    apply: {engine: stream, trigger_interval_s: 0.2}")
    text.write_text(text.read_text() + "".join(f"  - name: shop.public.idle_{i:02d}\n" for i in range(40)))
    config = load_config(text)
    tables = [lake_table(config, t) for t in config.tables]
    given: list[tuple[str, Any]] = []

    class Idle(StreamApply):
        def apply_table(self, table: Any, committed: Any, watermarks: Any) -> TableApplied | None:
            given.append((table.topic, watermarks))
            return None  # nothing new

    kafka = AskedKafka()
    for down in (False, True):
        given.clear()
        kafka.questions.clear()
        kafka.down = down
        stop = threading.Event()
        engine = Idle(None, Ledger(str(tmp_path / "lake")), kafka, tables, config.sources["shop"].apply)  # type: ignore[arg-type]
        with engine:
            threading.Timer(0.5, stop.set).start()
            engine.run_forever(stop)
        assert {topic for topic, _ in given} == {t.topic for t in tables}
        assert kafka.questions[0] == [t.topic for t in tables]  # the first pass: every table in one question
        assert len(kafka.questions) < len(given) / 10, (len(kafka.questions), len(given))
        if down:
            assert all(marks is None for _, marks in given)  # each asks on its own
        else:
            assert all(marks == {0: (0, len(topic))} for topic, marks in given)


def test_continuous_mode_starts_a_tables_batches_no_closer_than_min_batch_interval(tmp_path: Path) -> None:
    """``apply.min_batch_interval_s``: every table keeps its own spacing (Spark's
    processingTime trigger), a batch longer than the spacing is followed at once, and
    without the setting a table goes again as soon as it is done."""
    import itertools
    import threading
    import time

    from cdc_platform.lake.apply import StreamApply, TableApplied
    from cdc_platform.lake.tables import lake_table

    text = _config(tmp_path, "    apply: {engine: stream, trigger_interval_s: 0.1, min_batch_interval_s: 0.6}")
    text.write_text(text.read_text() + "  - name: shop.public.slow\n")
    config = load_config(text)
    tables = [lake_table(config, t) for t in config.tables]
    starts: dict[str, list[float]] = {t.key: [] for t in tables}

    class Timed(StreamApply):  # each table "applies" a batch: 0.05 s, or 1.0 s for the slow one
        def apply_table(self, table: Any, committed: Any, watermarks: Any) -> TableApplied:
            starts[table.key].append(time.monotonic())
            time.sleep(1.0 if table.key.endswith("slow") else 0.05)
            return TableApplied(table.key, batch=f"b{len(starts[table.key])}")

    def run(settings: Any, seconds: float) -> dict[str, list[float]]:
        for batches in starts.values():
            batches.clear()
        stop = threading.Event()
        engine = Timed(None, Ledger(str(tmp_path / "lake")), AskedKafka(), tables, settings)  # type: ignore[arg-type]
        with engine:
            threading.Timer(seconds, stop.set).start()
            engine.run_forever(stop)
        return {k: [b - a for a, b in itertools.pairwise(v)] for k, v in starts.items()}

    spaced = run(config.sources["shop"].apply, 3.1)
    fast, slow = spaced["shop.public.orders"], spaced["shop.public.slow"]
    # not every 0.05 s. The engine spaces the moments it submits a batch; this stamp is taken
    # in the pool's thread a moment later, so two stamps may be closer by that jitter (0.3 ms seen)
    assert 3 <= len(fast) <= 5 and all(gap >= 0.6 - 0.02 for gap in fast), fast
    assert slow and all(0.95 <= gap < 1.4 for gap in slow), slow  # longer than the spacing: at once
    unspaced = run(config.sources["shop"].apply.model_copy(update={"min_batch_interval_s": 0.0}), 1.5)
    assert len(unspaced["shop.public.orders"]) >= 10, unspaced  # back to back


def test_the_apply_command_takes_sources_groups_and_once() -> None:
    """``cdc-platform apply`` parses what the README documents (the integration tests run
    the group's tables in their own Spark; the parse is this)."""
    from cdc_platform.cli.main import build_parser

    args = build_parser().parse_args(["apply", "--source", "shop", "--group", "big", "--group", "small", "--once"])
    assert (args.source, args.group, args.once) == (["shop"], ["big", "small"], True)
    whole = build_parser().parse_args(["apply", "--all"])
    assert (whole.all, whole.group, whole.once) == (True, None, False)


def test_the_continuous_apply_waits_out_a_ledger_it_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply's own ledger reads (the committed generations, its lease) failing, as a
    store out of reach does, are waited out with backoff: the long-running process goes on
    instead of ending, and reads again once the store answers."""
    import threading

    from cdc_platform.config.model import ApplyConfig, ApplyEngine
    from cdc_platform.lake.apply import StreamApply

    ledger = Ledger(str(tmp_path))
    calls, stop = [], threading.Event()

    def committed_all() -> dict[str, Any]:
        calls.append(len(calls))
        if len(calls) <= 2:
            raise OSError("the store does not answer (injected)")
        if len(calls) >= 4:
            stop.set()
        return {}

    monkeypatch.setattr(ledger, "committed_all", committed_all)
    settings = ApplyConfig(engine=ApplyEngine.STREAM, trigger_interval_s=0.05)
    with StreamApply(None, ledger, None, [], settings) as engine:  # type: ignore[arg-type]
        engine.run_forever(stop)
    assert len(calls) >= 4


def test_an_apply_whose_lease_another_host_took_while_it_could_not_renew_stops(tmp_path: Path) -> None:
    """An apply on another host sees only heartbeats: once this one's are older than the
    TTL it may take the lease. This apply, its ledger back, must then stop, not write too."""
    from datetime import UTC, datetime, timedelta

    from cdc_platform.lake.apply import ApplyLease
    from cdc_platform.model.leases import LEASE_TTL_S, LeaseEvent, LeaseState

    ledger = Ledger(str(tmp_path))
    lease = ApplyLease(ledger, ["apply:shop"])
    now = datetime.now(UTC)

    def heartbeat(at: datetime) -> LeaseEvent:
        return LeaseEvent("apply:shop", lease.holder, lease.host, lease.pid, LeaseState.HELD, at)

    ledger.record_lease(heartbeat(now - timedelta(seconds=LEASE_TTL_S + 60)))  # its last one, long ago
    ledger.record_lease(LeaseEvent("apply:shop", "h2:7:other", "h2", 7, LeaseState.HELD, now - timedelta(seconds=5)))
    lease.held = True
    with pytest.raises(FatalError, match="another process took it") as lost:
        lease.confirm()
    assert lost.value.reason == "apply_lease_lost"
    ledger.record_lease(heartbeat(now))  # had its heartbeat been written in time: still its lease
    lease.confirm()
