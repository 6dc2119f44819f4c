"""The correctness bar: after a mixed workload, current equals the source exactly —
with the snapshot taken during the workload, windows materialized out of order and one
of them twice, and the merge applied incrementally."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.test_capture_faults import DDL, Workload

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"])


@pytest.fixture(
    params=["driver", "driver, latest by Spark", "spark"],
    ids=["merged by delta-rs in the driver", "merged by delta-rs, latest per key by Spark", "merged by Spark"],
)
def merge_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A small current merges in the driver (``lake.driver_merge``), the latest event per
    key computed in Arrow; a batch too big to collect whole has it computed by Spark first;
    with the threshold below every table, through Spark's MERGE. The merge rules hold on all."""
    from cdc_platform.lake import driver_merge

    if request.param == "spark":
        monkeypatch.setattr(driver_merge, "DRIVER_MERGE_MAX_ROWS", -1)
    if request.param == "driver, latest by Spark":
        monkeypatch.setattr(driver_merge, "DRIVER_EVENTS_MAX", -1)
    return str(request.param)


def assert_merged_by(path: str, merge_path: str, *, truncates: bool = False) -> None:
    """Every MERGE into ``path`` was written by the path the test asked for (no fallback).
    ``truncates``: batches holding a truncate are Spark's on every path, so a driver path
    need only have merged some."""
    from deltalake import DeltaTable

    merges = [c for c in DeltaTable(path).history() if c.get("operation") == "MERGE"]
    by_delta_rs = [str(c.get("clientVersion", "")).startswith("delta-rs") for c in merges]
    if truncates and merge_path != "spark":
        assert any(by_delta_rs), merges
    else:
        assert merges and all(d is (merge_path != "spark") for d in by_delta_rs), merges


def test_current_equals_source_after_a_mixed_workload(env: CaptureEnv, spark: Any) -> None:
    for t in ("items", "lines"):
        env.configure_table(t, "changelog: {grace_s: 0}")
        # incremental generations (the default) in chunks of 50 rows: each chunk is read at
        # its own instant while the workload changes the table; the replay must converge
        env.configure_table(t, "snapshot: {mode: incremental, chunk_rows: 50}")
    lake = Lake(env.config, spark)
    keys = [f"cap.{env.schema}.{t}" for t in ("items", "lines")]
    env.run_until_caught_up()
    for key in keys:  # warm the JVM's JDBC path; g1 below is the latest generation
        lake.snapshot(key, "g0")
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)

    # the bootstrap generation, taken while the workload runs
    t_taken = _generation_during_workload(env, lake, keys, "g1", Workload(env, seconds=None, seed=3))
    t_end = datetime.now(UTC).replace(microsecond=0)
    # three windows up to the instant the generation was taken, and the last after it: the
    # changes made after the generation (at least 50) are in the last window alone, so the
    # second, incremental apply below has some to apply however fast this machine is (equal
    # quarters could put them all in window 2, applied by the first)
    size = (t_taken - t0) / 3
    windows = [(t0 + i * size, t0 + (i + 1) * size) for i in range(3)] + [(t_taken, t_end)]

    for key in keys:
        for i in (2, 0):  # out of order
            lake.window(key, *windows[i])
        first = lake.current(key)
        assert first.rebuilt and first.generation == "g1"
        for i in (3, 1, 2):  # the rest, and window 2 again
            lake.window(key, *windows[i])
        second = lake.current(key)
        assert not second.rebuilt and second.changes_applied > 0
        assert not second.waiting_for

    assert_current_equals_source(lake, keys)

    # a new generation (a rehydration) taken while the workload runs: current rebuilds from
    # it and then follows the changelog after its watermark
    _generation_during_workload(env, lake, keys, "g2", Workload(env, seconds=None, seed=4, first_id=100_000))
    t_next = datetime.now(UTC).replace(microsecond=0)
    for key in keys:
        lake.window(key, t_end, t_next)
        third = lake.current(key)
        assert third.rebuilt and third.generation == "g2"
    assert_current_equals_source(lake, keys)


def _generation_during_workload(
    env: CaptureEnv, lake: Lake, keys: list[str], generation: str, workload: Workload
) -> datetime:
    """Capture streams and the workload runs while a generation of every table is taken —
    changes before, during and after it, whatever the machine's speed; returns, once capture
    has every change in Kafka and their timestamps are in the past, the instant every table's
    generation had been taken (before the changes made after it)."""
    with env.running_capture():
        workload.start()
        workload.wait_for(50)
        for key in keys:
            result = lake.snapshot(key, generation)
            assert not result.consistent and result.spark_partitions > 1, result  # chunks at their own instants
        taken = datetime.now(UTC)
        workload.wait_for(50)
        workload.stop()
        assert workload.error is None
    env.run_until_caught_up()
    time.sleep(1.1)
    return taken


def assert_current_equals_source(lake: Lake, keys: list[str], at_least: int = 100) -> None:
    """Current holds exactly the source's rows, each as often (position columns aside).
    Compared in Python: the tables are small, and two collects cost a fraction of two
    ``exceptAll`` shuffles and a Delta copy of the source."""
    for key in keys:
        truth = lake.truth_rows(key)
        assert len(truth) > at_least
        assert_same_rows(truth, lake.read_current(key).collect())


def assert_same_rows(expected: list[Any], actual: list[Any]) -> None:
    """The two lists of Spark rows hold the same rows, each as often (a multiset, as
    ``exceptAll`` both ways)."""
    wanted, got = Counter(map(_hashable, expected)), Counter(map(_hashable, actual))
    missing, extra = wanted - got, got - wanted
    assert (missing.total(), extra.total()) == (0, 0), (list(missing)[:5], list(extra)[:5])


def _hashable(value: Any) -> Any:
    """A row's value as something a Counter can hold: arrays, maps, structs and binary as tuples and bytes."""
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):  # a Row is a tuple
        return tuple(_hashable(v) for v in value)
    return bytes(value) if isinstance(value, bytearray) else value


@pytest.fixture
def types_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    from cdc_platform_tests.cases.pg_types import type_cases_ddl

    yield from make_capture_env(demo_db, tmp_path, type_cases_ddl(), ["type_cases"])


@pytest.mark.spark_codegen
def test_every_type_case_through_the_changelog_equals_the_source(types_env: CaptureEnv, spark: Any) -> None:
    from cdc_platform_tests.cases.pg_types import TYPE_CASES

    env = types_env
    env.configure_table("type_cases", "changelog: {grace_s: 0}")
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.type_cases"
    env.run_until_caught_up()
    lake.snapshot(key, "g1")  # empty: every row arrives through the changelog
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.app() as app:
        for name, _, literal in TYPE_CASES:
            app.execute(f"INSERT INTO type_cases (case_name, {name}) VALUES ('{name}', {literal})".encode())
        app.execute("UPDATE type_cases SET c_text = 'changed' WHERE case_name = 'c_jsonb'")
        app.execute("DELETE FROM type_cases WHERE case_name = 'c_inet'")
    env.run_until_caught_up()
    time.sleep(1.1)
    lake.window(key, t0, datetime.now(UTC).replace(microsecond=0))
    result = lake.current(key)
    assert result.changes_applied == len(TYPE_CASES) + 2
    truth, current = lake.truth(key), lake.read_current(key)
    assert truth.schema == current.schema
    assert truth.count() == len(TYPE_CASES) - 1
    missing, extra = truth.exceptAll(current).collect(), current.exceptAll(truth).collect()
    assert (missing, extra) == ([], [])


def test_a_stale_event_after_a_delete_does_not_bring_the_row_back(spark: Any, tmp_path: Path, merge_path: str) -> None:
    """At least once: capture re-sends events after a restart. An insert older than the
    key's delete must not resurrect the row, whether or not the batch also holds new
    events; a batch of only new events skips the check (nothing in it can be stale)."""
    from cdc_platform.lake.current import apply_current
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[(10, 1)])  # generation: key 10

    def apply(events: list[tuple[str, int, int, int]]) -> set[int]:
        """(op, key, value, commit position) events as one decoded batch; current's keys after."""
        return {k for k, _ in table.apply(events)}

    apply_current(spark, table.ledger, table.table)
    assert apply([("c", 1, 1, 100), ("d", 1, 1, 200)]) == {10}
    assert apply([("c", 1, 1, 100), ("u", 10, 2, 300)]) == {10}  # the insert again, with a new event
    assert apply([("c", 1, 1, 100)]) == {10}  # the insert again, alone
    assert apply([("c", 2, 5, 400)]) == {10, 2}  # only new events: the check is skipped
    assert apply([("c", 1, 7, 500)]) == {10, 2, 1}  # a real re-insert after the delete comes back
    assert apply([("d", 1, 1, 200)]) == {10, 2, 1}  # the delete again: older than the row, it removes nothing
    assert_merged_by(table.table.current_path, merge_path)


def test_a_rebuilt_current_is_as_fresh_as_its_generation_not_of_unknown_lag(spark: Any, tmp_path: Path) -> None:
    """Current rebuilt from a generation holds the source as of the generation's watermark.
    Before, its position had no source time until a change was applied, so with offsets
    waiting the fresh check found its lag unknown and passed: a table whose apply never got
    past the rebuild looked fresh for as long as it stayed so. Now the rebuild records the
    watermark's time, and the lag runs from it."""
    from cdc_platform.lake.current import apply_current, streamed_position
    from cdc_platform.orchestration.metadata import freshness_lag_s, is_fresh
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[(1, 1), (2, 2)])
    committed = table.ledger.committed(table.table.key)
    assert committed is not None and committed.watermark is not None
    taken_at = committed.watermark.taken_at
    rebuilt = apply_current(spark, table.ledger, table.table)
    assert rebuilt.rebuilt and rebuilt.last_source_ts == taken_at
    reported = streamed_position(table.ledger, table.table)  # what a Dagster run of the table checks
    assert reported.last_source_ts == taken_at
    lag = freshness_lag_s(reported, offsets_behind=5)
    assert lag is not None and lag >= (datetime.now(UTC) - taken_at).total_seconds() - 1
    assert not is_fresh(reported, 5, within_s=0.0)  # changes waiting, and the generation is older than that
    assert is_fresh(reported, 0, within_s=0.0)  # caught up: fresh however old the generation


def test_a_column_a_rebuild_dropped_is_added_again_when_the_source_brings_it_back(
    spark: Any, tmp_path: Path, merge_path: str
) -> None:
    """Current's columns are remembered between batches (its schema is not read for every
    batch). A rebuild from a generation without a column forgets them: when the source
    adds the column again, its batch adds it to current instead of merging into a table
    that no longer has it."""
    from cdc_platform.lake import current
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[(1, 1), (2, 2)])
    current.apply_current(spark, table.ledger, table.table)

    def notes() -> dict[int, str | None]:
        rows = spark.read.format("delta").load(table.table.current_path)
        return {r["id"]: r["note"] for r in rows.collect()} if "note" in rows.columns else {}

    table.apply([("u", 1, 10, 100)], added={"note": "first"})
    assert notes() == {1: "first", 2: None}
    table.new_generation("g2", [(1, 10), (2, 2)], 200)  # taken after the source dropped the column
    current.apply_current(spark, table.ledger, table.table)
    assert notes() == {}  # the rebuilt current has no such column
    assert table.apply([("u", 2, 20, 300)], added={"note": "again"}) == [(1, 10), (2, 20)]
    assert notes() == {1: None, 2: "again"}
    assert_merged_by(table.table.current_path, merge_path)


@pytest.mark.parametrize("big", [False, True], ids=["small current", "big current: the batch's keys listed"])
def test_a_batch_merges_the_same_whether_its_keys_are_listed_in_the_merge(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: bool
) -> None:
    """Into a big current the MERGE's condition also lists the batch's keys (Spark then
    drops current's other rows before the MERGE's join, Delta skips files outside them).
    The key match implies it, so updates, deletes, inserts, several events of one key and
    a batch re-sent after capture restarted land as they do without it."""
    from delta.tables import DeltaTable

    from cdc_platform.lake import current, driver_merge
    from cdc_platform_tests.spark.synthetic import StreamedTable

    monkeypatch.setattr(current, "KEY_FILTER_MIN_ROWS", 0 if big else 10**12)
    monkeypatch.setattr(driver_merge, "DRIVER_MERGE_MAX_ROWS", -1)  # a current this small merges in the driver
    table = StreamedTable(spark, tmp_path, rows=[(k, k) for k in range(1, 21)])
    current.apply_current(spark, table.ledger, table.table)

    def apply(events: list[tuple[str, int, int, int]]) -> list[tuple[int, int]]:
        """Current's rows after the batch, every one (a key matched by mistake would be twice)."""
        return table.apply(events)

    batch = [("u", 3, 33, 100), ("d", 5, 5, 110), ("c", 30, 300, 120), ("u", 9, 90, 130), ("u", 9, 91, 140)]
    expected = {k: k for k in range(1, 21) if k != 5} | {3: 33, 9: 91, 30: 300}
    assert apply(batch) == sorted(expected.items())
    re_sent = apply([*batch, ("u", 12, 120, 150)])  # re-sent, then one new event
    assert re_sent == sorted((expected | {12: 120}).items())
    predicate = DeltaTable.forPath(spark, table.table.current_path).history(1).first()["operationParameters"]
    assert ("IN (3,5,9,12,30)" in predicate["predicate"]) is big, predicate


def test_a_value_no_event_of_the_batch_carried_stays_as_current_has_it(
    spark: Any, tmp_path: Path, merge_path: str
) -> None:
    """An update that does not resend an unchanged TOASTed value keeps current's, also in a
    batch of full images otherwise, and a later event that carries it again replaces it."""
    from cdc_platform.lake import current
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[(k, k) for k in range(1, 11)])
    current.apply_current(spark, table.ledger, table.table)

    def apply(events: list[tuple[str, int, int, int]], toasted: frozenset[int] = frozenset()) -> dict[int, int]:
        return dict(table.apply(events, toasted))

    expected = {k: k for k in range(1, 11)}
    # key 3's update does not carry v; key 6 carries it, then an update that does not
    after = apply([("u", 3, 0, 100), ("u", 4, 44, 110), ("u", 6, 66, 120), ("u", 6, 0, 130)], frozenset({0, 3}))
    assert after == expected | {4: 44, 6: 66}
    full = apply([("u", 3, 33, 140), ("c", 20, 200, 150), ("u", 6, 67, 160)])
    assert full == expected | {3: 33, 4: 44, 6: 67, 20: 200}
    assert_merged_by(table.table.current_path, merge_path)


def test_current_follows_the_source_through_any_redelivery_and_any_batching(
    spark: Any, tmp_path: Path, merge_path: str
) -> None:
    """Model-based: a random history of inserts, updates (some not carrying a TOASTed
    value), deletes, re-inserts and truncates, delivered at least once (restarts re-send
    from earlier points) and cut into batches anywhere. After every batch current holds
    exactly the source's rows as of the newest change delivered so far: nothing re-sent
    moves a row back or brings a deleted or truncated one back, no TOASTed value is lost,
    on every merge path. (An insert re-sent after its truncate was applied came back until
    the re-sent truncate removed it again: current remembered deletes per key, not truncates.)"""
    import random

    from cdc_platform.lake import current
    from cdc_platform_tests.cases.redelivery import batch_events, delivered, rows_after, source_history, stale_resends
    from cdc_platform_tests.spark.synthetic import StreamedTable

    # seed and length: every case under test occurs in 16 batches (a batch is a merge; this
    # test ran 24 batches on each of three paths before, CI's budget is minutes)
    rng = random.Random(1)
    generation = {k: k for k in range(1, 11)}
    table = StreamedTable(spark, tmp_path, rows=sorted(generation.items()))
    current.apply_current(spark, table.ledger, table.table)
    history = source_history(rng, generation, changes=45)
    batches = delivered(rng, history)
    assert stale_resends(history, batches) >= {"c", "u", "d", "after t"}  # the cases under test all occur
    newest = 0
    for batch in batches:
        events, toasted = batch_events(history, batch)
        newest = max(newest, *(i + 1 for i in batch))
        assert dict(table.apply(events, toasted)) == rows_after(generation, history, newest), (batch, newest)
    assert newest == len(history)
    assert_merged_by(table.table.current_path, merge_path, truncates=True)


@pytest.mark.parametrize("refusal", ["features", "error"], ids=["a Delta feature delta-rs does not write", "an error"])
def test_a_current_delta_rs_refuses_is_merged_by_spark_with_a_warning(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    """The driver's merge gives way to Spark's for the table: the batch lands once, the log
    names the reason once (a warning for an error; at info for a table whose features
    delta-rs does not write, e.g. column mapping: that is by design), and the next batches
    go through Spark without asking again."""
    from cdc_platform.lake import current, driver_merge
    from cdc_platform_tests.spark.synthetic import StreamedTable

    if refusal == "features":
        monkeypatch.setattr(driver_merge, "WRITABLE_FEATURES", frozenset())
    else:

        def failing(*_args: object) -> None:
            raise RuntimeError("type_coercion: no common type")

        monkeypatch.setattr(driver_merge, "_merge", failing)
    table = StreamedTable(spark, tmp_path, rows=[(k, k) for k in range(1, 6)])
    current.apply_current(spark, table.ledger, table.table)

    def apply(events: list[tuple[str, int, int, int]]) -> dict[int, int]:
        return dict(table.apply(events))

    with caplog.at_level("INFO", logger="cdc_platform.current"):
        assert apply([("u", 2, 22, 100), ("d", 3, 3, 110), ("c", 9, 99, 120)]) == {1: 1, 2: 22, 4: 4, 5: 5, 9: 99}
        assert apply([("u", 4, 44, 130)]) == {1: 1, 2: 22, 4: 44, 5: 5, 9: 99}
    said = [r for r in caplog.records if "merged through Spark" in r.getMessage()]
    reason, level = ("written by Spark only", "INFO") if refusal == "features" else ("type_coercion", "WARNING")
    assert len(said) == 1 and reason in said[0].getMessage() and table.table.key in said[0].getMessage(), said
    assert said[0].levelname == level
    position = table.ledger.current(table.table.key)
    assert position is not None and position.rows == 5  # the row count moved by Spark's metrics
    assert_merged_by(table.table.current_path, "spark")
    if refusal == "error":
        assert driver_merge.refused.pop(table.table.current_path)  # expected here; the suite's guard sees none
    else:
        assert table.table.current_path in driver_merge.spark_only and not driver_merge.refused


LATEST_ROW = "struct<a:bigint,b:string,v:bigint,s:string,d:decimal(12,2),at:timestamp>"


def test_the_drivers_latest_event_per_key_is_sparks(spark: Any) -> None:
    """delta-rs merges the batch's latest event per key; for a batch the driver holds it is
    computed in Arrow (``driver_merge.latest_in_driver``). On a random batch of a composite
    key (NULL in its text part too), duplicates across two Kafka partitions at equal commit
    positions, deletes with key-only images, TOASTed values and real NULLs, it must equal
    Spark's (``current._latest_per_key``), row for row. A float key is Spark's to group."""
    import random
    from decimal import Decimal

    from pyspark.sql import functions as F

    from cdc_platform.lake.current import _latest_per_key
    from cdc_platform.lake.driver_merge import collected_events, collected_latest, latest_in_driver

    rng = random.Random(7)
    columns = ["v", "s", "d", "at"]
    rows = []
    for offset in range(600):
        a, b = rng.randrange(40), rng.choice(["x", "y", None, "ü"])
        op = rng.choice("ccuuuud")
        image = {"a": a, "b": b, "v": rng.choice([None, rng.randrange(9)]), "s": rng.choice([None, "t", ""]),
                 "d": rng.choice([None, Decimal("-1.50"), Decimal("2.00")]),
                 "at": rng.choice([None, datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)])}  # fmt: skip
        toasted = [c for c in columns if rng.random() < 0.2] if op == "u" else []
        before = {"a": a, "b": b, "v": None, "s": None, "d": None, "at": None} if op == "d" else None
        commit = rng.randrange(30)  # many events share a commit position: the offset decides
        event = {"kafka_partition": offset % 2, "kafka_offset": offset // 2, "op": op, "commit_lsn": commit,
                 "lsn": commit + rng.randrange(2), "before": before, "after": None if op == "d" else image,
                 "unavailable": toasted or rng.choice([None, []]), "source_ts": datetime.now(UTC)}  # fmt: skip
        rows.append(event)
    schema = (
        f"kafka_partition int, kafka_offset long, op string, commit_lsn long, lsn long, before {LATEST_ROW}, "
        f"after {LATEST_ROW}, unavailable array<string>, source_ts timestamp"
    )
    batch = spark.createDataFrame(rows, schema)
    keys = ["a", "b"]
    by_spark = collected_latest(_latest_per_key(batch, keys, columns), keys, columns)
    in_driver = latest_in_driver(collected_events(batch), keys, columns)
    assert in_driver is not None and in_driver.num_rows == by_spark.num_rows > 100
    assert in_driver.column_names == by_spark.column_names

    def by_key(table: Any) -> list[Any]:
        return sorted(table.to_pylist(), key=lambda r: (r["__key_0"], r["__key_1"] or ""))

    assert by_key(in_driver) == by_key(by_spark)
    assert any(not r["__has_0"] for r in by_key(in_driver)) and any(r["__op"] == "d" for r in by_key(in_driver))
    floats = batch.withColumn("after", F.col("after").withField("a", F.col("after.a").cast("double")))
    assert latest_in_driver(collected_events(floats), keys, columns) is None
