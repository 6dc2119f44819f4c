"""The stream apply (``cdc-platform apply``): one Spark application applies a source's
tables, micro-batch by micro-batch, on the real stack.

* Under a mixed workload, with a generation taken while it streams and a second one
  later, current equals the source and every Kafka offset is in the changelog once.
* Cut at each step of a batch (planned / changelog appended / ranges recorded / current
  merged), the process the user runs resumes with nothing lost and nothing doubled (SIGKILLs
  of the continuous process at random instants under load: integration/test_faults.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from delta.tables import DeltaTable

from cdc_platform.devtools.apply_process import KILLED, ApplyProcess
from cdc_platform.devtools.faults import APPLY_CUTS
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.py4j_trips import RoundTrips
from cdc_platform.lake.apply import StreamApply, TableApplied, describe, load_state
from cdc_platform.lake.changelog import batch_identity, decodes_in_jvm, seal_day
from cdc_platform.lake.compare import history_chain
from cdc_platform.lake.crash_points import APPLY_POINTS
from cdc_platform.lake.tables import lake_table
from cdc_platform.lake.verify import VerifyContext, verify_table
from cdc_platform.model.coverage import walk
from cdc_platform.model.errors import ChangelogGapError
from cdc_platform.model.rehydration import changelog_gap
from cdc_platform.model.windows import (
    DAY_S,
    BatchPlan,
    is_batch_key,
    next_batch_ranges,
    window_key,
    window_start,
)
from cdc_platform.orchestration.partitions import day_partition_key
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.test_capture_faults import DDL, Workload
from cdc_platform_tests.spark.test_current import assert_current_equals_source

pytestmark = pytest.mark.integration

PAUSE_S = 0.08  # ~10 transactions/s: a busy table, and batches a 2-core CI machine applies in seconds
STREAMED = "    apply: {engine: stream, trigger_interval_s: 0.2, max_offsets_per_batch: 50000}"


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"], source_yaml=STREAMED)


def _keys(env: CaptureEnv) -> list[str]:
    return [f"cap.{env.schema}.{t}" for t in env.tables]


def _assert_each_offset_once_and_no_hole(lake: Lake, spark: Any, key: str) -> None:
    table = lake.table(key)
    changelog = spark.read.format("delta").load(table.changelog_path)
    rows = changelog.count()
    assert rows == changelog.select("kafka_partition", "kafka_offset").distinct().count(), "an offset twice"
    days = [r[0] for r in changelog.select("window_start").distinct().collect()]
    assert 1 <= len(days) <= 2 and not any(is_batch_key(d) for d in days)  # a partition per day, not per batch
    committed = lake.ledger.committed(key)
    assert committed is not None and committed.watermark is not None
    ranges = [r.offsets for rs in lake.ledger.windows(key).values() for r in rs]
    coverage = walk(committed.watermark.kafka_end_offsets, ranges)
    assert not coverage.holes and coverage.frontier == lake.kafka.end_offsets(table.topic)
    position = lake.ledger.current(key)
    assert position is not None and position.frontier == coverage.frontier  # current applied all of it


@pytest.mark.long_running
def test_the_stream_apply_keeps_current_equal_to_the_source(env: CaptureEnv, spark: Any) -> None:
    env.configure_table("items", "history: true")  # history merged beside current, checked while it streams
    lake, keys = Lake(env.config, spark), _keys(env)
    # auto compaction at 4 small files instead of 50: this test's batches reach it
    spark.conf.set(MIN_FILES, "4")
    try:
        with env.stream_apply(spark) as engine:
            _stream_a_mixed_workload(env, lake, keys, engine)
    finally:
        spark.conf.unset(MIN_FILES)
    # each batch's append adds a file per Kafka partition to the changelog: Delta compacted
    # them (the rows are the source's and every offset is in the changelog once, asserted
    # above), so file counts do not grow with the batches. Current (this small, merged in
    # the driver) rewrites the files a batch touches: its files do not pile up either.
    table = lake.table(keys[0])
    history = DeltaTable.forPath(spark, table.changelog_path).history().collect()
    compactions = [
        r for r in history if r["operation"] == "OPTIMIZE" and r["operationParameters"].get("auto") == "true"
    ]
    assert compactions, "no auto compaction of the changelog"
    # batches are appended by delta-rs in the driver, but the table's first (it creates the
    # table) and every minNumFiles-th, whose Spark commit auto-compacts the day's small files
    appends = {
        int(r["userMetadata"].rsplit("#", 1)[1]): str(r["engineInfo"])
        for r in history
        if r["operation"] == "WRITE" and (r["userMetadata"] or "").startswith("cdc_platform.apply.")
    }
    by_spark = {n for n, engine_info in appends.items() if not engine_info.startswith("delta-rs")}
    compacting = {n for n in appends if n % 4 == 0 and n != min(appends)}
    assert compacting and len(appends) > len(compacting) + 1, appends  # both kinds of append were made
    assert by_spark == {min(appends)} | compacting, appends
    merges = [r for r in DeltaTable.forPath(spark, table.current_path).history().collect() if r["operation"] == "MERGE"]
    files = spark.sql(f"DESCRIBE DETAIL delta.`{table.current_path}`").first()["numFiles"]
    assert len(merges) >= 5 and files <= 4, (len(merges), files)


MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"


def _stream_a_mixed_workload(env: CaptureEnv, lake: Lake, keys: list[str], engine: StreamApply) -> None:
    spark = lake.spark
    with env.running_capture():
        workload = Workload(env, seconds=None, seed=11, pause_s=PAUSE_S)
        workload.start()
        workload.wait_for(30)
        assert engine.run_pass() == []  # no generation yet: nothing to decode with, nothing applied
        for key in keys:
            lake.snapshot(key, "g1")  # taken while the workload runs
        workload.wait_for(25)
        batches = engine.run_pass()
        lake.snapshot(keys[0], "g2")  # a second generation of items while it streams
        workload.wait_for(25)
        batches += engine.run_pass()
        batches += _verify_while_it_streams(lake, keys[0], engine, workload)
        workload.stop()
        assert workload.error is None
        with env.app() as app:
            app.execute("TRUNCATE lines")
            app.execute("INSERT INTO lines VALUES (1, 1, 'after the truncate')")
    env.run_until_caught_up()
    batches += engine.run_until_caught_up()
    assert {a.table for a in batches if a.batch is not None} == set(keys)
    assert not any(a.reapplied for a in batches)  # nothing was interrupted: no batch takes the recovery path
    rebuilt = [a for a in batches if a.current is not None and a.current.rebuilt]
    assert {(a.table, a.current.generation) for a in rebuilt if a.current} >= {(keys[0], "g2"), (keys[1], "g1")}
    _each_batch_knows_its_oldest_change(batches)
    assert_current_equals_source(lake, keys[:1], at_least=20)
    assert lake.read_current(keys[1]).collect() == lake.truth(keys[1]).collect()  # one row after the truncate
    _sealing_a_day_compacts_it(lake, keys[0])
    for key in keys:
        _assert_each_offset_once_and_no_hole(lake, spark, key)
    # items' history is small: its streamed batches were sequenced in the driver and merged by delta-rs
    history = DeltaTable.forPath(spark, lake.table(keys[0]).history_path).history().collect()
    assert any(r["operation"] == "MERGE" and str(r["engineInfo"]).startswith("delta-rs") for r in history), history
    assert engine.run_pass() == []  # caught up: an idle pass writes nothing
    _a_pass_reads_no_growing_ledger_table(env, lake, keys, engine)
    _the_keys_check_reads_the_streamed_changelog(env, lake, keys[1], engine)


def _each_batch_knows_its_oldest_change(batches: list[TableApplied]) -> None:
    """A batch of 25 s of the workload holds changes committed over those 25 s: the log's
    "behind the source" is its newest change's wait, and the oldest change's (commit ->
    current, the batch's longest) is logged beside it (``describe``). A batch of a pass that
    rebuilt current from a generation gives none: its changes below the watermark came with
    the snapshot, and their old commits would read as minutes of waiting."""
    rebuilt = [a for a in batches if a.batch is not None and a.current is not None and a.current.rebuilt]
    assert rebuilt and all(a.oldest_change_ts is None for a in rebuilt), rebuilt
    assert all("oldest change" not in describe(a) for a in rebuilt)
    merged = [a for a in batches if a.oldest_change_ts is not None]
    assert merged
    spans = []
    for applied in merged:
        assert applied.current is not None and applied.current.changes_applied, applied
        oldest, newest = applied.oldest_change_ts, applied.current.last_source_ts
        assert oldest is not None and newest is not None and oldest <= newest, applied
        spans.append((newest - oldest).total_seconds())
        assert "s behind the source, oldest change " in describe(applied)
    assert max(spans) > 5, spans  # a batch spans seconds of commits, not one instant


def _sealing_a_day_compacts_it(lake: Lake, key: str) -> None:
    """Sealing a day (what the apply does once the UTC day is over) leaves the day's
    changelog partition in one file with exactly the same rows, and names no hole where a
    generation committed that day restarted the batches (the compaction itself, from many
    files: ``test_compacting_a_day_rewrites_only_that_day``)."""
    from pyspark.sql import functions as F

    table, spark = lake.table(key), lake.spark
    changelog = spark.read.format("delta").load(table.changelog_path)
    day = changelog.groupBy("window_start").count().orderBy(F.desc("count")).first()["window_start"]
    version = DeltaTable.forPath(spark, table.changelog_path).history(1).first()["version"]

    def day_rows(at: int | None = None) -> Any:
        reader = spark.read.format("delta")
        reader = reader.option("versionAsOf", at) if at is not None else reader
        return reader.load(table.changelog_path).where(F.col("window_start") == day)

    files_before = len(day_rows().inputFiles())
    sealed = seal_day(spark, lake.ledger, table, day)
    after, before = day_rows(), day_rows(version)
    assert files_before >= 1 and len(after.inputFiles()) == 1
    assert after.exceptAll(before).count() == 0 and before.exceptAll(after).count() == 0
    assert sum(sealed.events.values()) == after.count() and sealed.sealed and sealed.clean, sealed
    # every record its batches wrote counted back (changelog rows and dead letters)
    held = after.count() + sealed.dead_letters
    assert sealed.records_counted and sealed.records_written == sealed.records_held == held, sealed


@contextmanager
def applying_in_a_thread(engine: StreamApply) -> Iterator[list[Any]]:
    """The apply's passes one after another in a thread for the block, as ``run_forever``
    runs them; yields the list they append their results to."""
    applied: list[Any] = []
    stop = threading.Event()

    def keep_applying() -> None:
        while not stop.is_set():
            applied.extend(engine.run_pass())
            time.sleep(0.2)

    applying = threading.Thread(target=keep_applying, daemon=True)
    applying.start()
    try:
        yield applied
    finally:
        stop.set()
        applying.join(120)


def _history_check(lake: Lake, key: str) -> Any:
    from cdc_platform.lake.compare import compare_history
    from cdc_platform.model.tables import TableSchema

    committed = lake.ledger.committed(key)
    assert committed is not None
    schema = TableSchema.from_json(committed.schema_json)
    return compare_history(lake.spark, lake.ledger, lake.kafka, lake.table(key), schema)


def _verify_while_it_streams(lake: Lake, key: str, engine: StreamApply, workload: Workload) -> list[Any]:
    """``verify`` on a table that never stops changing while the apply keeps merging:
    exact on its first round (current read at one version, the keys changed meanwhile
    left out), not DIFFERS because the apply moved on between the two reads (before:
    every round differed, and verify gave up on the running demo after 10 minutes). And
    the history check there: current and history commit each batch in turn, so it pins
    both after the frontier both applied and leaves out the keys beyond it (without that,
    a throwaway run found hundreds of differences)."""
    with applying_in_a_thread(engine) as applied:
        before = workload.transactions
        verdict = verify_table(VerifyContext(lake.spark, lake.ledger, lake.source(key), lake.kafka), lake.table(key),
                               timeout_s=300, rounds=1)  # fmt: skip
        during = workload.transactions - before
        histories = [_history_check(lake, key) for _ in range(2)]
        chains = [history_chain(lake.spark, lake.table(key), ["id"]) for _ in range(2)]
    for history in histories:  # history's check, pinned after the frontier both applied
        rows = history.rows
        assert rows is not None and rows.compared > 0, history.note
        assert (rows.missing, rows.extra, rows.differing, rows.repeated) == (0, 0, 0, 0), rows.sample
    assert any(history.in_flight_keys > 0 for history in histories)  # it compared while both moved
    assert all(chain.versions > 0 and chain.faults == 0 for chain in chains), chains  # each batch commits whole
    assert verdict.ok, (verdict.note, verdict.sample)
    assert verdict.source_rows >= 20 and verdict.current_version >= 0
    assert during >= 10 and verdict.in_flight_keys > 0  # it compared while the table and current moved
    assert any(a.batch is not None for a in applied)
    return applied


def _a_pass_reads_no_growing_ledger_table(env: CaptureEnv, lake: Lake, keys: list[str], engine: StreamApply) -> None:
    """The windows and batches tables grow with every batch; a running apply keeps what it
    needs of them in memory, so a pass costs the same after a year as after a minute."""
    with env.app() as app:
        app.execute("INSERT INTO lines VALUES (2, 1, 'one more')")
    env.run_until_caught_up()
    reads: list[str] = []
    ledger = engine.ledger
    growing = ("windows", "batches", "last_batch", "current", "stream_starts")
    for name in growing:
        original = getattr(ledger, name)
        setattr(ledger, name, lambda *a, _n=name, _f=original: reads.append(_n) or _f(*a))
    try:
        applied = engine.run_pass()
    finally:
        for name in growing:
            delattr(ledger, name)
    assert [a.table for a in applied if a.batch is not None] == [keys[1]]
    assert reads == []
    assert lake.read_current(keys[1]).count() == 2


def _the_keys_check_reads_the_streamed_changelog(env: CaptureEnv, lake: Lake, key: str, engine: StreamApply) -> None:
    """The keys check reads the changelog's recent records: each Kafka key holds exactly the
    table's key, and each record (partition, offset) is in the changelog once. It looked for
    the recent records by window key, and a streamed changelog's partitions are days, not
    windows: it checked no record at all and passed, whatever the records held. A record
    keyed by another producer, and a record appended twice, now fail it; sealing the day
    counts the record appended twice too."""
    from confluent_kafka import Producer
    from pyspark.sql import functions as F

    from cdc_platform.lake.checks import check_keys, recent_changelog

    spark, table, keys = lake.spark, lake.table(key), ["order_id", "line_no"]
    clean = check_keys(lake.read_current(key), recent_changelog(spark, lake.ledger, table), keys)
    assert clean.kafka_events_checked > 0 and clean.passed, clean
    row = {"order_id": 2, "line_no": 1, "note": "one more"}  # the last insert (_a_pass_reads_no_growing_ledger_table)
    original = [m for m in env.consume(["lines"]) if m.value and m.envelope["after"] == row][-1]
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    foreign_key = b'{"order_id": 2, "line_no": 1, "tenant": 1}'
    producer.produce(table.topic, original.value, key=foreign_key, partition=original.partition)
    assert producer.flush(10) == 0
    redelivered = [a for a in engine.run_until_caught_up() if a.batch is not None]
    assert [a.table for a in redelivered] == [key]
    # the record's commit is minutes old, but current held it already: it waited for nothing,
    # and the fresh check must not read its commit as a change's wait
    assert redelivered[0].oldest_change_ts is None and "oldest change" not in describe(redelivered[0])
    changelog = spark.read.format("delta").load(table.changelog_path)
    record = (F.col("kafka_partition") == original.partition) & (F.col("kafka_offset") == original.offset)
    twice = changelog.where(record)
    assert _day_check_run(env, table, day_partition_key(table.config, twice.first()["window_start"])).passed
    twice.localCheckpoint().write.format("delta").mode("append").save(table.changelog_path)  # as a doubling bug would
    broken = check_keys(lake.read_current(key), recent_changelog(spark, lake.ledger, table), keys)
    assert (broken.kafka_key_mismatches, broken.kafka_unstable_rows, broken.changelog_records_twice) == (1, 1, 1)
    assert broken.current_passed and not broken.changelog_passed  # current is right: only the non-blocking check fails
    assert any('"tenant":1' in s for s in broken.kafka_sample), broken.kafka_sample
    assert f"partition {original.partition} offset {original.offset}" in " ".join(broken.kafka_sample)
    day = twice.first()["window_start"]
    failed = _day_check_run(env, table, day_partition_key(table.config, day))
    assert (failed.passed, failed.metadata["records_twice"].value, failed.metadata["holes"].value) == (False, 1, 0)
    assert failed.description is not None and "1 record(s) twice" in failed.description
    assert failed.metadata["records_missing"].value == 0  # a copy is not a record more
    # a record gone from the changelog (a lost file, a stray DELETE): its offsets are still
    # covered by the batches' ranges, so the day passed; counted back against what its batches
    # wrote (the ledger keeps it), the day fails
    other = changelog.where((F.col("window_start") == day) & ~record).first()
    gone = (F.col("kafka_partition") == other["kafka_partition"]) & (F.col("kafka_offset") == other["kafka_offset"])
    DeltaTable.forPath(spark, table.changelog_path).delete(gone)
    lost = _day_check_run(env, table, day_partition_key(table.config, day))
    assert (lost.passed, lost.metadata["records_missing"].value, lost.metadata["records_counted"].value) == (
        False, 1, True
    ), lost.metadata  # fmt: skip
    assert lost.description is not None and "1 record(s) its batches wrote no longer in it" in lost.description
    sealed = seal_day(spark, lake.ledger, table, day)
    assert sealed.records_twice == 1 and sealed.records_missing == 1 and not sealed.clean, sealed


def _day_check_run(env: CaptureEnv, table: Any, partition: str) -> Any:
    """The changelog's ``every_offset_once`` check run for one day, as a user runs it from
    the UI (the stream apply reports it itself when it seals a day): its evaluation."""
    import dagster as dg

    from cdc_platform.orchestration.definitions import build_definitions
    from cdc_platform.orchestration.keys import DAY_CHECK, changelog_asset_key
    from cdc_platform.orchestration.partitions import changelog_days_partitions

    check = dg.AssetCheckKey(changelog_asset_key(table.config), DAY_CHECK)
    job = dg.define_asset_job("day_check", selection=dg.AssetSelection.checks(check))
    defs = dg.Definitions.merge(build_definitions(env.config_path), dg.Definitions(jobs=[job]))
    with dg.DagsterInstance.ephemeral() as instance:
        days = changelog_days_partitions(table.config).name
        assert days is not None
        instance.add_dynamic_partitions(days, [partition])
        run = defs.resolve_job_def("day_check").execute_in_process(
            instance=instance, tags={"dagster/partition": partition}, raise_on_error=False
        )
        assert run.success
        [evaluation] = run.get_asset_check_evaluations()
    assert evaluation.partition == partition
    return evaluation


def _apply(env: CaptureEnv, *args: str, fault: str | None = None) -> int:
    """``cdc-platform apply`` as the user runs it, optionally cut at a crash point: its exit status."""
    process = ApplyProcess(env.config_path, "cap", env.config_path.parent / "apply.log", {})
    process.start(*args, crash_point=fault)
    return process.wait_exit(timeout_s=300)


def _changes(env: CaptureEnv, seed: int, first_id: int, transactions: int = 40) -> None:
    workload = Workload(env, seconds=None, seed=seed, first_id=first_id, pause_s=PAUSE_S)
    workload.start()
    workload.wait_for(transactions)
    workload.stop()
    assert workload.error is None


def _a_generation_and_changes(env: CaptureEnv, spark: Any, seed: int) -> tuple[Lake, str]:
    """The env's one table with a generation, then ten transactions captured after it."""
    lake, key = Lake(env.config, spark), _keys(env)[0]
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    _changes(env, seed=seed, first_id=100, transactions=10)
    env.run_until_caught_up()
    return lake, key


@pytest.fixture
def one_table_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    """One table, reached through Kafka's SASL_SSL/SCRAM listener as a production cluster is:
    capture's producer, the apply's offset questions and Spark's Kafka source (the JVM
    decoder ``auto`` picks) all authenticate."""
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items"], source_yaml=STREAMED, authenticated=True)


def test_an_apply_cut_at_any_step_resumes_exactly(one_table_env: CaptureEnv, spark: Any) -> None:
    """The crash points the fault suite does not cut, deterministically; SIGKILLs of the
    continuous process at random instants and at APPLY_CUTS under load, with several
    tables, are the fault suite's (integration/test_faults.py).
    One table: a run dies at the first table that reaches the point, so a second table
    would add batches to every run and no cut of its own."""
    env = one_table_env
    lake, keys = Lake(env.config, spark), _keys(env)
    _changes(env, seed=1, first_id=1)
    env.run_until_caught_up()
    for key in keys:
        lake.snapshot(key, "g1")
    # cut between two steps of a batch: each run dies there, the next one resumes (the
    # fault suite cuts the long-running process at the other points, APPLY_CUTS, under load)
    for i, point in enumerate(p for p in APPLY_POINTS if p not in APPLY_CUTS):
        _changes(env, seed=10 + i, first_id=1000 * (i + 1))
        env.run_until_caught_up()
        assert _apply(env, "--once", fault=point) == KILLED, point
    env.run_until_caught_up()
    # the Dagster instance's schema check is quiet in the runs that were cut (a run's INFO
    # lines: unit/test_cli_and_code_location.py)
    assert "alembic" not in (env.config_path.parent / "apply.log").read_text()
    # the next run resumes what the cut ones left: `apply --once`'s engine, in this process's
    # Spark (a third cold driver cost the suite half a minute; the fault suite resumes the
    # long-running process itself after its cuts)
    with env.stream_apply(spark) as engine:
        resumed = engine.run_until_caught_up()
    assert any(a.reapplied for a in resumed), "the batch cut short was not re-applied"
    assert_current_equals_source(lake, keys, at_least=20)
    for key in keys:  # every batch cut short was applied later with the offsets it was planned with
        recorded = lake.ledger.windows(key)
        plans = lake.ledger.batches(key)
        assert len(plans) >= 2 and [p.number for p in plans] == list(range(1, len(plans) + 1))
        assert all(recorded[p.key] == p.as_window(reused=False).ranges for p in plans)
    for key in keys:
        _assert_each_offset_once_and_no_hole(lake, spark, key)


def test_a_batch_delta_rs_appended_before_a_failure_is_not_appended_again(
    one_table_env: CaptureEnv, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's append (``lake.driver_append``) committed, then the batch failed before
    its ranges were recorded (the ledger unreachable): the apply retries the batch, finds
    its identity in the changelog's commits and appends nothing twice."""
    from cdc_platform.lake import changelog

    env = one_table_env
    lake, key = _a_generation_and_changes(env, spark, seed=3)
    cut = {"left": 1}

    def failing_once(point: str) -> None:
        if point == "apply.changelog_written" and cut["left"]:
            cut["left"] -= 1
            raise RuntimeError("the ledger is unreachable (injected)")

    with env.stream_apply(spark) as engine:
        engine.run_until_caught_up()  # batch 1 creates the changelog (Spark's append)
        _changes(env, seed=4, first_id=200, transactions=10)
        env.run_until_caught_up()
        monkeypatch.setattr(changelog, "crash_point", failing_once)
        applied = engine.run_until_caught_up()  # fails once after the append, then retries
    assert cut["left"] == 0 and any(a.reapplied for a in applied), applied
    history = DeltaTable.forPath(spark, lake.table(key).changelog_path).history().collect()
    second = [r["engineInfo"] for r in history if r["userMetadata"] == batch_identity(lake.table(key), 2)]
    assert len(second) == 1 and second[0].startswith("delta-rs"), second
    _assert_each_offset_once_and_no_hole(lake, spark, key)
    assert_current_equals_source(lake, [key], at_least=10)


def test_a_restarted_apply_takes_current_where_the_ledger_left_it(
    one_table_env: CaptureEnv, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new apply (a deploy, a crash, the next scheduled run) finds each table's current at
    the frontier its ledger recorded: an idle table costs no Spark job and no ledger commit
    (a restart of 50 idle tables spent ~0.6 s of the pool per table recounting and recording
    each), and its next change merges straight into it. A table whose current is gone is
    rebuilt, and a lake whose tables lack today's properties gets them, as before."""
    from cdc_platform.lake.ledger import Ledger

    env = one_table_env
    lake, key = _a_generation_and_changes(env, spark, seed=5)
    with env.stream_apply(spark) as engine:
        engine.run_until_caught_up()
    left = lake.ledger.current(key)
    table = lake.table(key)
    spark.sql(f"ALTER TABLE delta.`{table.current_path}` UNSET TBLPROPERTIES ('delta.autoOptimize.autoCompact')")
    recorded: list[str] = []
    record_current = Ledger.record_current
    monkeypatch.setattr(Ledger, "record_current", lambda self, t, p: (recorded.append(t), record_current(self, t, p)))
    tracker = spark.sparkContext.statusTracker()
    with env.stream_apply(spark) as engine:  # the restart
        jobs = len(tracker.getJobIdsForGroup())
        assert engine.run_pass() == []  # nothing new: nothing to report
        assert (recorded, engine.positions()[key][0]) == ([], left)
        assert len(tracker.getJobIdsForGroup()) - jobs <= 1  # the property put back (Spark's ALTER), no more
        _changes(env, seed=6, first_id=200, transactions=10)
        env.run_until_caught_up()
        [applied] = engine.run_until_caught_up()
    assert applied.batch is not None and applied.current is not None and not applied.current.rebuilt
    assert applied.current.frontier != left.frontier
    properties = DeltaTable.forPath(spark, table.current_path).detail().first()["properties"]
    assert properties.get("delta.autoOptimize.autoCompact") == "true"
    assert_current_equals_source(lake, [key], at_least=10)
    with env.stream_apply(spark) as again, RoundTrips() as trips:  # its properties all there now
        assert again.run_pass() == []
    # an idle table's restart asks nothing of the driver's JVM: Spark's isDeltaTable, a log
    # replay, took 12 % of a restart of 40 tables behind (docs/benchmarks.md, "Stop 76").
    # Python's garbage collector may release earlier tests' JVM objects meanwhile (40 of them
    # in a fresh clone's run): not the restart's
    assert trips.asked == 0, trips.first
    Path(table.current_path, "_delta_log").rename(Path(table.current_path, "_delta_log.lost"))  # current lost
    with env.stream_apply(spark) as engine:
        [rebuilt] = engine.run_pass()
    assert rebuilt.current is not None and rebuilt.current.rebuilt
    assert_current_equals_source(lake, [key], at_least=10)


@pytest.fixture
def grouped_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    """Two tables of one source, ``lines`` in apply group ``big`` and partitioned by the hour."""
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"], source_yaml=STREAMED):
        entry = f"  - name: cap.{env.schema}.lines\n"
        settings = "    apply_group: big\n    changelog: {partition: hour}\n"
        env.config_path.write_text(env.config_path.read_text().replace(entry, entry + settings))
        yield env


@pytest.fixture
def deletable_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    """One table whose topic takes DeleteRecords (the delete policy): retention, on demand."""
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items"], source_yaml=STREAMED):
        text = env.config_path.read_text()
        policy = "  partitions: 3\n  cleanup_policy: compact,delete\n"
        env.config_path.write_text(text.replace("  partitions: 3\n", policy))
        yield env


def test_a_batch_whose_records_retention_deleted_is_a_gap_not_a_silent_loss(
    deletable_env: CaptureEnv, spark: Any
) -> None:
    """A batch is planned (then its process dies, or it is slow), and retention deletes its
    records before they are read. Spark's Kafka source skips missing offsets without a word
    (it must, for compaction), so the apply must notice: the table fails with a changelog
    gap, nothing of the batch is written or recorded, and the rehydration sensor's rule
    sees the gap. Before: the batch was recorded as applied with none of its changes, the
    frontier moved past the hole, and no check noticed."""
    env, spark_session = deletable_env, spark
    lake, [key] = Lake(env.config, spark_session), _keys(env)
    _changes(env, seed=1, first_id=1)
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    _changes(env, seed=2, first_id=1000)
    env.run_until_caught_up()
    table, committed = lake.table(key), lake.ledger.committed(key)
    assert committed is not None
    state = load_state(lake.ledger, table, committed)
    marks = lake.kafka.watermarks(table.topic)
    ranges = next_batch_ranges(key, state.recorded, marks, 50_000)
    assert sum(r.end - r.start for r in ranges) >= 40
    plan = BatchPlan(1, window_key(window_start(datetime.now(UTC), DAY_S)), ranges)
    lake.ledger.plan_batch(key, plan)  # what a process cut right after planning leaves behind
    admin = AdminClient({"bootstrap.servers": env.profile.kafka_bootstrap})
    ends = [TopicPartition(table.topic, p, high) for p, (_, high) in marks.items()]
    for future in admin.delete_records(ends).values():
        future.result(timeout=30)
    with env.stream_apply(spark_session) as engine:
        assert engine.run_pass() == []  # the table failed, kept to itself
        error = engine.health[key].error
    assert isinstance(error, ChangelogGapError), error
    assert "new generation" in str(error)
    assert plan.key not in lake.ledger.windows(key)  # nothing recorded as applied
    changelog = lake.table(key).changelog_path
    assert (
        not DeltaTable.isDeltaTable(spark_session, changelog)
        or spark_session.read.format("delta").load(changelog).count() == 0
    )
    earliest = {p: low for p, (low, _) in lake.kafka.watermarks(table.topic).items()}
    assert changelog_gap(key, "g1", load_state(lake.ledger, table, committed).recorded, earliest) is not None
    # the new generation the sensor starts: the batch planned before it is abandoned, not re-read forever
    _changes(env, seed=3, first_id=2000)
    env.run_until_caught_up()
    lake.snapshot(key, "g2")
    _changes(env, seed=4, first_id=3000)
    env.run_until_caught_up()
    with env.stream_apply(spark_session) as engine:
        applied = engine.run_until_caught_up()
    assert any(a.batch is not None for a in applied)
    assert_current_equals_source(lake, [key], at_least=20)


def test_a_lake_built_by_windows_goes_on_in_the_stream_with_deletion_vectors(env: CaptureEnv, spark: Any) -> None:
    """Existing lakes: a source that was applied by window runs into a current without
    deletion vectors or auto compaction (as before they existed) is switched to the stream:
    the apply continues at the windows' recorded frontier, gives current deletion vectors
    and its tables auto compaction, and current equals the source with every offset in
    the changelog once."""
    from datetime import timedelta

    from delta.tables import DeltaTable

    keys = _keys(env)
    config = env.config
    no_grace = [
        t.model_copy(update={"changelog": t.changelog.model_copy(update={"grace_s": 0.0})}) for t in config.tables
    ]
    lake_settings = config.lake.model_copy(update={"deletion_vectors": False})
    old = Lake(config.model_copy(update={"lake": lake_settings, "tables": no_grace}), spark)
    _changes(env, seed=3, first_id=1)
    env.run_until_caught_up()
    for key in keys:
        old.snapshot(key, "g1")
    _changes(env, seed=4, first_id=5000)
    env.run_until_caught_up()
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(seconds=1)
    time.sleep(1.5)  # the window is closed (no grace)
    for key in keys:
        assert old.window(key, start, end).rows > 0
        old.current(key)

    def properties(path: str) -> dict[str, str]:
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail is not None
        return dict(detail["properties"] or {})

    def deletion_vectors(key: str) -> bool:
        return properties(old.table(key).current_path).get("delta.enableDeletionVectors") == "true"

    def compacted_paths(key: str) -> list[str]:
        table = old.table(key)
        return [table.current_path, table.changelog_path, table.deletes_path]

    for path in [p for key in keys for p in compacted_paths(key)]:  # as lakes from before auto compaction
        spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES IF EXISTS ('delta.autoOptimize.autoCompact')")
    assert not any(deletion_vectors(key) for key in keys)
    _changes(env, seed=5, first_id=9000)  # more changes after the switch
    env.run_until_caught_up()
    # the stream apply in this process's Spark (the CLI's `apply --once` starts a driver of its
    # own for the same code: the apply cut test's)
    with env.stream_apply(spark) as engine:
        applied = engine.run_until_caught_up()
        assert [h.error for h in engine.health.values()] == [None, None]
    assert {a.table for a in applied if a.batch is not None} == set(keys)
    assert all(deletion_vectors(key) for key in keys)
    auto_compact = [properties(p).get("delta.autoOptimize.autoCompact") for key in keys for p in compacted_paths(key)]
    assert auto_compact == ["true"] * len(auto_compact)
    lake = Lake(env.config, spark)
    assert_current_equals_source(lake, keys, at_least=20)
    for key in keys:
        assert any(not is_batch_key(w) for w in lake.ledger.windows(key))  # the windows' ranges, kept
        _assert_each_offset_once_and_no_hole(lake, spark, key)


def test_a_scheduled_run_applies_what_is_available_and_reports_each_table(grouped_env: CaptureEnv, spark: Any) -> None:
    """The scheduled mode: the source's Dagster job (what ``apply.schedule`` starts) applies
    everything Kafka holds and stops; the run materializes today's changelog partition of
    each table and observes its current (current is materialized by the run that checks it),
    and a continuous apply holding the source makes it fail. Before it, ``cdc-platform apply
    --group big`` (its tables, applied here in the test's Spark) applies that group's table alone,
    into hourly changelog partitions."""
    import dagster as dg

    from cdc_platform.orchestration.definitions import build_definitions

    env, started = grouped_env, datetime.now(UTC)
    env.configure_table("items", f"checks: {{fresh_within_s: {FRESH_WITHIN_S}}}")  # the check cadence's run below
    lake, keys = Lake(env.config, spark), _keys(env)
    items, lines = keys
    _changes(env, seed=21, first_id=1)
    env.run_until_caught_up()
    for key in keys:
        lake.snapshot(key, "g1")
    _changes(env, seed=22, first_id=3000)
    env.run_until_caught_up()
    with env.stream_apply(spark, groups=["big"]) as big:  # `cdc-platform apply --once --group big`'s tables
        big.run_until_caught_up()
    assert lake.ledger.batches(lines) and not lake.ledger.batches(items)  # the group's table only
    defs = build_definitions(env.config_path)
    job = defs.resolve_job_def("cap__apply_job")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, resources=defs.resources)
        assert result.success
        materialized = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
        observed = {e.asset_key.path[-1] for e in result.get_asset_observation_events()}
        tables = [key.split(".")[-1] for key in keys]
        assert (materialized, observed) == ({"changelog"}, set(tables))  # changelog days; current of each
        days = [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == "changelog"]
        assert {e.partition for e in days} == {datetime.now(UTC).strftime("%Y-%m-%d")}  # items' (lines was applied)
        assert all(e.materialization.metadata["batches"].value >= 1 for e in days)  # type: ignore[union-attr]
        assert_current_equals_source(lake, keys, at_least=20)
        _each_changelog_partition_is_a_day_or_an_hour(lake, spark, {items: DAY_S, lines: 3_600}, started)
        _the_ten_minute_run_checks_a_streamed_current(env, defs, instance, keys[0])
        with env.stream_apply(spark) as holder:  # a continuous apply of the source
            holder.run_pass()
            refused = job.execute_in_process(instance=instance, resources=defs.resources, raise_on_error=False)
        assert not refused.success
        failure = next(e for e in refused.all_events if e.is_step_failure)
        assert "already applied by another process" in str(failure.step_failure_data.error)  # type: ignore[union-attr]


def _each_changelog_partition_is_a_day_or_an_hour(
    lake: Lake, spark: Any, sizes: dict[str, int], started: datetime
) -> None:
    """Each table's batches wrote to the changelog partition of the day (or hour) they were planned in."""
    ended = datetime.now(UTC)
    for key, size in sizes.items():
        planned_in = {window_key(window_start(t, size)) for t in (started, ended)}
        batches = {p.day for p in lake.ledger.batches(key)}
        changelog = spark.read.format("delta").load(lake.table(key).changelog_path)
        assert batches and batches <= planned_in
        assert {r[0] for r in changelog.select("window_start").distinct().collect()} == batches


def _the_ten_minute_run_checks_a_streamed_current(env: CaptureEnv, defs: Any, instance: Any, key: str) -> None:
    """The run the check cadence starts for a streamed table: it writes nothing, materializes
    current as the apply left it (a checked version) and evaluates its checks, ``fresh``
    among them (from the ledger's frontier and the topic's end offsets)."""
    import dagster as dg

    from cdc_platform.orchestration.keys import FRESH_CHECK, current_asset_key

    current = current_asset_key(env.config.table(key))
    job = dg.define_asset_job("check_current", selection=dg.AssetSelection.assets(current))
    with env.running_capture():  # as a user runs it: the row comparison needs capture to confirm its read
        _wait_for_a_heartbeat(env)
        run = (
            dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
            .resolve_job_def("check_current")
            .execute_in_process(instance=instance, raise_on_error=False)
        )
    assert run.success
    assert [e.asset_key for e in run.get_asset_materialization_events()] == [current]
    verdicts = {e.check_name: e.passed for e in run.get_asset_check_evaluations()}
    assert verdicts == {FRESH_CHECK: True, "schema_compatible": True, "keys": True, "changelog_keys": True,
                        "completeness": True}, verdicts  # fmt: skip
    fresh = next(e for e in run.get_asset_check_evaluations() if e.check_name == FRESH_CHECK)
    assert fresh.metadata["offsets_behind"].value == 0  # the apply job applied everything there was
    assert fresh.metadata["capture_silent_s"].value < 3  # a heartbeat a second

    # capture stopped: current still holds everything Kafka has, but no longer what the source
    # has. Once no running capture would be this silent (three heartbeats) and for longer
    # than fresh_within_s, the check fails and says what to start (it passed, 0 s behind)
    time.sleep(FRESH_WITHIN_S + 1)
    run = (
        dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
        .resolve_job_def("check_current")
        .execute_in_process(instance=instance, raise_on_error=False)
    )
    fresh = next(e for e in run.get_asset_check_evaluations() if e.check_name == FRESH_CHECK)
    assert not fresh.passed and fresh.metadata["offsets_behind"].value == 0, fresh
    assert fresh.metadata["capture_silent_s"].value > FRESH_WITHIN_S
    assert "capture of source 'cap' has shown no sign of reading the source" in str(fresh.description)
    assert "cdc-platform capture run --source cap" in str(fresh.description)


def _wait_for_a_heartbeat(env: CaptureEnv) -> None:
    """Until the running capture's first heartbeat (a second after it starts) is in Kafka."""
    from cdc_platform.sources import open_source

    source, deadline = open_source(env.config, "cap"), time.monotonic() + 20
    while (silence := source.capture_silences().get(env.config.tables[0].key)) is None or silence.seconds > 2:
        assert time.monotonic() < deadline, silence
        time.sleep(0.2)


FRESH_WITHIN_S = 4  # the check cadence test's table: over three heartbeats of its capture (one a second)


def test_a_re_applied_batch_finds_its_committed_append_by_the_identity_in_the_commit(
    spark: Any, tmp_path: Path
) -> None:
    """A batch cut short after its changelog append committed is not appended again: the
    commit carries the batch's identity (``userMetadata``), which the re-apply looks for."""
    from cdc_platform.lake.changelog import BatchWrite, append_options, committed_before

    path = str(tmp_path / "changelog")
    config = load_config_text(tmp_path)
    table = lake_table(config, config.tables[0])
    for number in (1, 2):
        frame = spark.createDataFrame([(number,)], "n long")
        frame.write.format("delta").mode("append").options(**append_options(table, BatchWrite(number))).save(path)
    assert committed_before(spark, path, f"cdc_platform.apply.{table.key}#2")
    assert committed_before(spark, path, f"cdc_platform.apply.{table.key}#1")
    assert not committed_before(spark, path, f"cdc_platform.apply.{table.key}#3")
    assert not committed_before(spark, str(tmp_path / "absent"), f"cdc_platform.apply.{table.key}#1")


def test_compacting_a_day_rewrites_only_that_day(spark: Any, tmp_path: Path) -> None:
    """A sealed day's changelog partition (a file per Kafka partition and batch) becomes one
    file with the same rows; the day still filling keeps its files."""
    from pyspark.sql import functions as F

    from cdc_platform.lake.changelog import compact_day

    config = load_config_text(tmp_path)
    table = lake_table(config, config.tables[0])
    days = ("2026-11-25T00:00:00Z", "2026-11-26T00:00:00Z")
    for batch in range(6):
        rows = [(batch * 10 + i, day) for i in range(10) for day in days]
        frame = spark.createDataFrame(rows, "kafka_offset long, window_start string").repartition(3)
        frame.write.format("delta").mode("append").partitionBy("window_start").save(table.changelog_path)

    def files(day: str) -> int:
        frame = spark.read.format("delta").load(table.changelog_path).where(F.col("window_start") == day)
        return len(frame.inputFiles())

    before = {day: files(day) for day in days}
    rows_before = spark.read.format("delta").load(table.changelog_path).collect()
    removed, added = compact_day(spark, table, days[0])
    assert before[days[0]] >= 6 and (removed, added) == (before[days[0]], 1)
    assert files(days[0]) == 1 and files(days[1]) == before[days[1]]
    assert sorted(spark.read.format("delta").load(table.changelog_path).collect()) == sorted(rows_before)


def load_config_text(tmp_path: Path) -> Any:
    from cdc_platform.config import load_config

    path = tmp_path / "cdc_platform.yaml"
    path.write_text(
        "sources: {s: {database: d, user: u, password_env: PW, apply: {engine: stream}}}\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\nlake: {root: lake}\ntables: [{name: s.public.t}]\n"
    )
    return load_config(path)


@pytest.mark.parametrize("merge", ["driver", "spark"])
def test_the_apply_deletes_the_files_its_batches_replaced(one_table_env: CaptureEnv, spark: Any, merge: str) -> None:
    """Batches replace files of current: the driver's merge rewrites the files it touches,
    Spark's MERGE (``driver_merge_max_rows: 0``) writes deletion vectors and its auto
    compaction rewrites small files. With no retention and a VACUUM on every pass, the
    apply leaves no replaced file on disk, and current (its deletion vectors included)
    still holds the source's rows. Without the VACUUM the replaced files stay: the check
    of the disk fails."""
    env = one_table_env
    settings = "  retain_old_files_hours: 0\n  vacuum_every_minutes: 0\n"
    settings += "  driver_merge_max_rows: 0\n" if merge == "spark" else ""
    env.config_path.write_text(
        env.config_path.read_text().replace("lake:\n  root: lake\n", f"lake:\n  root: lake\n{settings}")
    )
    lake, keys = Lake(env.config, spark), _keys(env)
    table = lake.table(keys[0])
    assert table.retain_old_files_hours == 0 and table.vacuum_every_s == 0
    _changes(env, seed=1, first_id=1)
    env.run_until_caught_up()
    lake.snapshot(keys[0], "g1")
    spark.conf.set(MIN_FILES, "4")  # Spark's MERGEs reach auto compaction within the test
    deleted = 0  # what the passes said their VACUUMs deleted (shown on current in the UI)
    try:
        with env.stream_apply(spark) as engine:
            for i in range(5):
                _changes(env, seed=30 + i, first_id=1000 * (i + 1), transactions=15)
                with env.app() as app:  # rows of earlier batches: the files holding them are replaced
                    app.execute("UPDATE items SET qty = qty + 1 WHERE id %% 3 = %s", (i % 3,))
                    app.execute("DELETE FROM items WHERE id = (SELECT min(id) FROM items)")
                env.run_until_caught_up()
                applied = engine.run_until_caught_up()
                deleted += sum(a.vacuumed.files_deleted for a in applied if a.vacuumed is not None)
    finally:
        spark.conf.unset(MIN_FILES)
    for path in (table.current_path, table.changelog_path):
        ever, live = _files_ever_added(path), _live_files(path)
        replaced = ever - live
        assert replaced, f"no batch replaced a file of {path}: nothing to vacuum, the test proves nothing"
        on_disk = {str(p.relative_to(path)) for p in Path(path).rglob("*.parquet")}
        assert not (replaced & on_disk), sorted(replaced & on_disk)[:5]
        assert live <= on_disk
    if merge == "spark":  # Spark's MERGEs mark replaced rows in deletion vectors; a later MERGE replaces them
        live_vectors, ever = _vectors(table.current_path, live=True), _vectors(table.current_path, live=False)
        replaced_vectors = ever - live_vectors
        assert live_vectors and replaced_vectors, "no deletion vector replaced: nothing proven"
        vectors_on_disk = {p.name for p in Path(table.current_path).glob("deletion_vector_*.bin")}
        assert not (replaced_vectors & vectors_on_disk), sorted(replaced_vectors & vectors_on_disk)[:5]
        assert live_vectors <= vectors_on_disk
    vacuums = [
        r for r in DeltaTable.forPath(spark, table.current_path).history().collect() if "VACUUM" in r["operation"]
    ]
    assert vacuums, "no VACUUM commit in current's log"
    assert deleted >= len(_files_ever_added(table.current_path) - _live_files(table.current_path))
    assert_current_equals_source(lake, keys, at_least=20)


def test_a_backlog_batch_of_a_small_table_is_held_in_the_driver(one_table_env: CaptureEnv, spark: Any) -> None:
    """A batch of more than 10 000 changes whose records fit ``lake.driver_batch_max_mb`` is
    decoded into the driver in one Spark job and appended to the changelog by delta-rs (Spark
    appends whatever the driver does not hold, above 10 000 rows), and current still equals
    the source. With the old bound (10 000 records) delta-rs does not append it: this fails.
    The table keeps a history, small too: the batch's versions are sequenced in the driver
    and merged by delta-rs (before, a table with history never held a batch this big).
    Kafka speaks TLS and authenticates here (SASL_SSL/SCRAM), and the records are still read by Spark's Kafka source."""
    env = one_table_env
    env.configure_table("items", "history: true")
    lake, keys = Lake(env.config, spark), _keys(env)
    table = lake.table(keys[0])
    assert decodes_in_jvm(table, env.config.kafka)
    _changes(env, seed=1, first_id=1, transactions=10)
    env.run_until_caught_up()
    lake.snapshot(keys[0], "g1")
    with env.stream_apply(spark) as engine:
        _changes(env, seed=2, first_id=1000, transactions=10)
        env.run_until_caught_up()
        engine.run_until_caught_up()  # the changelog's first append (Spark's: it creates the table)
        with env.app() as app:
            app.execute(
                "INSERT INTO items (id, body, qty) SELECT g, md5(g::text), g % 7 FROM generate_series(1, 12000) g "
                "ON CONFLICT (id) DO UPDATE SET qty = items.qty + 1"
            )
        env.run_until_caught_up()
        applied = engine.run_until_caught_up()
    big = [a for a in applied if a.offsets > 10_000]
    assert len(big) == 1 and big[0].changelog is not None and big[0].changelog.rows >= 12_000, applied
    history = DeltaTable.forPath(spark, table.changelog_path).history().collect()
    identity = batch_identity(table, int(str(big[0].batch).rsplit("#", 1)[1]))
    engines = [str(r["engineInfo"]) for r in history if r["userMetadata"] == identity]
    assert len(engines) == 1 and engines[0].startswith("delta-rs"), (identity, engines)
    assert_current_equals_source(lake, keys, at_least=11_999)
    versions = big[0].current.history if big[0].current is not None else None
    assert versions is not None and versions.versions_opened >= 12_000, big[0]
    last = DeltaTable.forPath(spark, table.history_path).history(1).first()
    assert last["operation"] == "MERGE" and str(last["engineInfo"]).startswith("delta-rs"), last
    chain = history_chain(spark, table, ["id"])
    open_versions = spark.read.format("delta").load(table.history_path).where("is_current").count()
    assert chain.faults == 0 and open_versions == lake.read_current(keys[0]).count(), chain


def test_a_batch_too_big_for_the_driver_is_applied_by_spark_not_retried_forever(
    one_table_env: CaptureEnv, spark: Any
) -> None:
    """Current's narrow rows estimate a burst of wide rows far too small: the driver tries to
    hold the batch, and Spark refuses the collect (``spark.driver.maxResultSize``, a user's
    setting; the default 1 GB is the same wall further out). The long-running apply must
    then apply the batch with Spark's jobs and MERGE, and say why, not retry the same
    collect until the table is stuck (what it did: every retry planned the batch alike)."""
    env = one_table_env
    with env.config_path.open("a") as config:  # the apply process's Spark, as a user sets it
        config.write("spark:\n  conf:\n    spark.driver.maxResultSize: 4m\n")
    lake, keys = Lake(env.config, spark), _keys(env)
    _changes(env, seed=1, first_id=1, transactions=10)
    env.run_until_caught_up()
    lake.snapshot(keys[0], "g1")
    with env.stream_apply(spark) as engine:  # current's files, and the estimate: narrow rows
        _changes(env, seed=2, first_id=1000, transactions=10)
        env.run_until_caught_up()
        engine.run_until_caught_up()
    with env.app() as app:  # ~16 MB of records: 5 000 rows of 3 200 hexadecimal characters
        app.execute(
            "INSERT INTO items (id, body, qty) SELECT g, (SELECT string_agg(md5(g::text || i::text), '') "
            "FROM generate_series(1, 100) i), 1 FROM generate_series(100000, 104999) g"
        )
    env.run_until_caught_up()
    assert _apply(env, "--once") == 0, (env.config_path.parent / "apply.log").read_text()[-4000:]
    said = (env.config_path.parent / "apply.log").read_text()
    assert "too big for the driver" in said and "is bigger than spark.driver.maxResultSize" in said
    assert "[retriable]" not in said  # the same attempt went on through Spark: no failed try, no backoff
    assert_current_equals_source(lake, keys, at_least=5000)


def _files_ever_added(path: str) -> set[str]:
    """Every data file a commit of the table's log added (relative paths)."""
    import json
    from urllib.parse import unquote

    added = set()
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.add(unquote(action["add"]["path"]))
    return added


def _vectors(path: str, *, live: bool) -> set[str]:
    """The deletion-vector files the table's latest version uses (``live``), or that any
    commit of its log added, by file name, replayed from the log's JSON commits as the Delta
    protocol names them (``<z85 of the uuid>`` -> ``deletion_vector_<uuid>.bin``)."""
    import json
    import uuid

    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

    def name(vector: dict[str, Any]) -> str:
        encoded, raw = vector["pathOrInlineDv"][-20:], b""
        for group in range(0, 20, 5):  # Z85: five characters, four bytes
            number = 0
            for char in encoded[group : group + 5]:
                number = number * 85 + alphabet.index(char)
            raw += number.to_bytes(4, "big")
        return f"deletion_vector_{uuid.UUID(bytes=raw)}.bin"

    added: dict[tuple[str, str], str] = {}
    ever = set()
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            for kind in ("add", "remove"):
                vector = action.get(kind, {}).get("deletionVector")
                key = (action.get(kind, {}).get("path", ""), json.dumps(vector))
                if kind == "add":
                    added[key] = name(vector) if vector and vector["storageType"] == "u" else ""
                    ever.add(added[key])
                elif kind in action:
                    added.pop(key, None)
    return {n for n in (added.values() if live else ever) if n}


def _live_files(path: str) -> set[str]:
    """The data files of the table's latest version (relative paths), from its log."""
    from urllib.parse import unquote

    import pyarrow as pa
    from deltalake import DeltaTable as RsTable

    return {unquote(p) for p in pa.table(RsTable(path).get_add_actions(flatten=True))["path"].to_pylist()}
