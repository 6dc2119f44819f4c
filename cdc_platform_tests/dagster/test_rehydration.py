"""The rehydration sensor on the real stack and a real Dagster instance: every trigger is
caused for real (signal row, DeleteRecords, slot dropped, current deleted, duplicate key,
incompatible ALTER TABLE), the sensor is evaluated with ``build_sensor_context``, its run
request is executed, and current equals the source afterwards."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from cdc_platform.devtools.daemon import Daemon
from cdc_platform.devtools.lake import Lake
from cdc_platform.orchestration.keys import KEYS_CHECK, SCHEMA_CHECK, current_asset_key, snapshot_asset_key
from cdc_platform.orchestration.partitions import generations_partitions
from cdc_platform.orchestration.runs import apply_current
from cdc_platform_tests.chunked import when_half_written
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.polling_env import PollingEnv
from cdc_platform_tests.spark.test_current import assert_same_rows

pytestmark = pytest.mark.integration

DDL = [
    "CREATE TABLE items (id int PRIMARY KEY, body text, qty int NOT NULL, note text)",
    "CREATE TABLE signals (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
]


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items"]):
        text = env.config_path.read_text().replace(
            "    heartbeat_interval_s: 1\n", f"    heartbeat_interval_s: 1\n    signal_table: {env.schema}.signals\n"
        )
        # DeleteRecords (the test's stand-in for retention) needs the delete policy
        env.config_path.write_text(
            text.replace("  partitions: 3\n", "  partitions: 3\n  cleanup_policy: compact,delete\n")
        )
        env.configure_table("items", "changelog: {grace_s: 0}")
        yield env


class Harness:
    """The code location built from the env's config, a real (temporary) instance, and the
    rehydration sensor evaluated tick by tick, its runs executed as the daemon would."""

    def __init__(self, env: CaptureEnv | PollingEnv, instance: dg.DagsterInstance, table_key: str = "") -> None:
        self.env, self.instance = env, instance
        self.config = env.config
        self.table = self.config.table(table_key or f"cap.{getattr(env, 'schema', '')}.items")
        self.daemon = Daemon(env.config_path, instance, log=lambda _m: None)
        self.defs = self.daemon.defs

    def tick(self) -> dg.SensorResult:
        return self.daemon.evaluate("rehydration")

    def expect(self, reason: str) -> dg.RunRequest:
        result = self.tick()
        assert [r.tags["cdc/reason"] for r in result.run_requests or []] == [reason], result
        [request] = result.run_requests or []
        return request

    def execute(self, request: dg.RunRequest, success: bool = True) -> dg.ExecuteInProcessResult:
        """What the daemon does with the request: add the partition, run the job."""
        name = generations_partitions(self.table).name
        assert name is not None and request.partition_key is not None
        self.instance.add_dynamic_partitions(name, [request.partition_key])
        result = self.daemon.execute(request)
        assert result.success is success
        return result

    def current(self) -> bool:
        [(_, success, _)] = apply_current(self.env.config_path, [self.table], self.instance)
        return success

    def check_passed(self, name: str) -> bool:
        key = dg.AssetCheckKey(current_asset_key(self.table), name)
        record = self.instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        return bool(record.status.value == "SUCCEEDED")


def _assert_current_equals_source(spark: Any, harness: Harness) -> None:
    lake = Lake(harness.config, spark)
    assert_same_rows(lake.truth_rows(harness.table.key), lake.read_current(harness.table.key).collect())


@pytest.mark.long_running
def test_each_trigger_starts_one_generation_and_current_follows(env: CaptureEnv, spark: Any) -> None:
    t_start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'b' || g, g FROM generate_series(1, 50) g")
    env.run_until_caught_up()
    with dg.instance_for_test() as instance:
        h = Harness(env, instance)

        # bootstrap: no generation yet
        h.execute(h.expect("bootstrap"))
        assert h.current()
        assert h.check_passed(KEYS_CHECK) and h.check_passed(SCHEMA_CHECK)
        assert not h.tick().run_requests  # healthy: nothing to do

        # a person asks, through the signal table (Debezium's shape)
        with env.app() as app:
            app.execute(
                "INSERT INTO signals VALUES ('s1', 'execute-snapshot', %s)",
                (f'{{"data-collections": ["{env.schema}.items"], "type": "blocking"}}',),
            )
        request = h.expect("manual")
        assert not h.tick().run_requests  # the same signal, and the generation in flight: no second run
        h.execute(request)
        records = instance.fetch_materializations(snapshot_asset_key(h.table), limit=1).records  # for display
        materialization = records[0].asset_materialization
        assert materialization is not None
        assert materialization.metadata["rehydration_reason"].value == "manual"
        assert not h.tick().run_requests

        # Kafka retention removed offsets the changelog still needs (a window was recorded
        # before, so the next window would start inside the hole)
        time.sleep(1.1)
        t_window = datetime.now(UTC).replace(microsecond=0)
        Lake(h.config, spark).window(h.table.key, t_start, t_window)
        with env.app() as app:
            app.execute("UPDATE items SET body = 'gap' WHERE id <= 20")
        env.run_until_caught_up()
        admin = AdminClient({"bootstrap.servers": env.profile.kafka_bootstrap})
        ends = {tp.partition: tp for tp in _end_offsets(env)}
        for future in admin.delete_records(list(ends.values())).values():
            future.result(timeout=30)
        request = h.expect("changelog_gap")
        assert "Kafka starts at" in request.tags["cdc/detail"]
        assert not h.tick().run_requests  # one cause, one generation
        h.execute(request)
        # the changelog resumes from the new watermark: the next window starts there
        with env.app() as app:
            app.execute("UPDATE items SET body = 'resumed' WHERE id > 40")
        env.run_until_caught_up()
        time.sleep(1.1)
        Lake(h.config, spark).window(h.table.key, t_window, datetime.now(UTC).replace(microsecond=0))
        assert h.current()
        _assert_current_equals_source(spark, h)
        assert not h.tick().run_requests

        # the current table is deleted
        shutil.rmtree(Lake(h.config, spark).table(h.table.key).current_path)
        h.execute(h.expect("current_missing"))
        assert h.current()
        _assert_current_equals_source(spark, h)

        # the replication slot is dropped: the generation creates a new one, capture resumes
        with env.admin() as pg:
            pg.execute("SELECT pg_drop_replication_slot(%s)", (env.slot,))
        request = h.expect("source_position_lost")
        h.execute(request)
        with env.admin() as pg:
            assert pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (env.slot,)).fetchone()
        with env.app() as app:
            app.execute("UPDATE items SET body = 'after slot' WHERE id = 1")
        env.run_until_caught_up()  # no SlotLostError: the generation's slot is there
        assert h.current()
        assert not h.tick().run_requests

        # a duplicate key in current fails the blocking keys check
        path = Lake(h.config, spark).table(h.table.key).current_path
        frame = spark.read.format("delta").load(path)
        frame.limit(1).write.format("delta").mode("append").save(path)
        from cdc_platform.lake.checks import check_keys

        report = check_keys(spark.read.format("delta").load(path), None, ["id"])
        assert report.duplicate_keys == 1 and not report.passed
        h.current()  # no new changes; its keys check sees the duplicate
        assert not h.check_passed(KEYS_CHECK)
        assert _downstream_requested(h) == 0  # blocked across runs, not only within one
        h.execute(h.expect("checks_failed"))
        assert h.current() and h.check_passed(KEYS_CHECK)
        assert _downstream_requested(h) == 1

        # incompatible schema changes under BACKWARD: a narrowed type, a required column dropped
        for alter, offending in (
            ("ALTER TABLE items ALTER COLUMN qty TYPE smallint", "qty changed type integer -> smallint"),
            ("ALTER TABLE items DROP COLUMN qty", "required column qty"),
        ):
            with env.app() as app:
                app.execute(alter.encode())
            assert not h.current()  # nothing merged: the schema check fails first
            assert not h.check_passed(SCHEMA_CHECK)
            request = h.expect("schema_incompatible")
            assert offending in request.tags["cdc/detail"]
            h.execute(request)
            assert h.current() and h.check_passed(SCHEMA_CHECK)  # the new generation is the new baseline
            _assert_current_equals_source(spark, h)
            assert not h.tick().run_requests

        # a compatible change (a nullable column dropped) passes without a new generation
        with env.app() as app:
            app.execute("ALTER TABLE items DROP COLUMN note")
        assert h.current() and h.check_passed(SCHEMA_CHECK)
        assert not h.tick().run_requests


def _downstream_requested(h: Harness) -> int:
    """How many runs declarative automation would start for a user's asset downstream of
    current that waits for current's blocking checks (the documented condition)."""

    @dg.asset(
        key=["user", "items_report"],
        deps=[current_asset_key(h.table)],
        automation_condition=dg.AutomationCondition.missing()
        & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    )
    def items_report() -> None: ...

    defs = dg.Definitions.merge(h.defs, dg.Definitions(assets=[items_report]))
    result = dg.evaluate_automation_conditions(defs=defs, instance=h.instance)
    return sum(1 for r in result.results if r.key == dg.AssetKey(["user", "items_report"]) and r.true_subset.size > 0)


def _end_offsets(env: CaptureEnv) -> list[TopicPartition]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": env.profile.kafka_bootstrap, "group.id": "test-ends"})
    try:
        topic = env.topic("items")
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p))[1]) for p in partitions
        ]
    finally:
        consumer.close()


# ---------------------------------------------------------------- issue 13's recovery bugs


def _five_rows_captured(env: CaptureEnv) -> None:
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'b', g FROM generate_series(1, 5) g")
    env.run_until_caught_up()


def _signal(env: CaptureEnv, ids: str) -> None:
    data = f'{{"data-collections": ["{env.schema}.items"]}}'
    with env.app() as app:
        app.execute(f"INSERT INTO signals SELECT 's' || g, 'execute-snapshot', %s FROM {ids} g".encode(), (data,))


def test_ten_thousand_windows_since_the_watermark_are_no_gap(env: CaptureEnv) -> None:
    """Bug 1: with 10 050 windows recorded since the watermark, the next offset the
    changelog needs is past all of them; Kafka holding only those is no gap."""
    from confluent_kafka import Producer

    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
    from cdc_platform.model.windows import WindowPlan, WindowRange

    env.run_until_caught_up()  # the topic exists
    table = env.config.table(f"cap.{env.schema}.items")
    topic = env.config.topic_for(table)
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap, "linger.ms": 50})
    for _ in range(100_500):
        while True:
            try:
                producer.produce(topic, b"{}", key=b"k", partition=0)
                break
            except BufferError:  # librdkafka's local queue is full (a busy machine): let it drain
                producer.poll(0.5)
        producer.poll(0)
    assert producer.flush(60) == 0
    admin = AdminClient({"bootstrap.servers": env.profile.kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 100_500)]).values():
        future.result(timeout=30)  # Kafka now starts at 100 500 on partition 0
    ledger = Ledger(env.config.lake.root)
    ends = {p: 0 for p in range(3)}
    ledger.record_generation(
        GenerationEvent(table.key, "g1", GenerationStatus.COMMITTED, cause="bootstrap",
                        watermark=Watermark(1, ends, datetime.now(UTC) - timedelta(days=8)))
    )  # fmt: skip
    ledger.record_windows(
        table.key,
        [WindowPlan(f"w{i:05d}", (WindowRange(0, i * 10, i * 10 + 10, f"w{i + 1:05d}"),), reused=False)
         for i in range(10_050)],
    )  # fmt: skip
    with dg.instance_for_test() as instance:
        result = Harness(env, instance).tick()
    assert not result.run_requests, result.skip_reason


def test_many_signal_rows_start_one_generation(env: CaptureEnv, spark: Any) -> None:
    """Bug 2: 1 001 signal rows (never pruned) ask once, not on every tick."""
    _five_rows_captured(env)
    with dg.instance_for_test() as instance:
        h = Harness(env, instance)
        h.execute(h.expect("bootstrap"))
        _signal(env, "generate_series(1, 1001)")
        request = h.expect("manual")
        assert "1001 rows" in request.tags["cdc/detail"]
        h.execute(request)
        assert not h.tick().run_requests
        assert not h.tick().run_requests
        _signal(env, "generate_series(2001, 2001)")  # a new row asks again, once
        h.execute(h.expect("manual"))
        assert not h.tick().run_requests


def test_a_failed_generation_does_not_block_rehydration(env: CaptureEnv, spark: Any) -> None:
    """Bug 3: a generation that failed is not 'in flight' forever, and a signal that
    arrived while it ran is acted on afterwards."""
    _five_rows_captured(env)
    with dg.instance_for_test() as instance:
        h = Harness(env, instance)
        request = h.expect("bootstrap")
        with env.app() as app:
            app.execute("ALTER TABLE items RENAME TO items_away")
        h.execute(request, success=False)  # fatal: the table is missing
        with env.app() as app:
            app.execute("ALTER TABLE items_away RENAME TO items")
        _signal(env, "generate_series(1, 1)")
        request = h.expect("manual")  # the failed bootstrap pauses before its retry; the signal goes first
        h.execute(request)
        assert h.current()
        _assert_current_equals_source(spark, h)
        assert not h.tick().run_requests


def test_a_killed_generation_is_resumed_by_the_sensor_without_reading_its_chunks_again(
    env: CaptureEnv, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bootstrap generation's run is SIGKILLed half-way (its process, as the daemon
    launched it), run monitoring fails the run, and the sensor's next request runs the same
    generation again, which reads only the chunks it had not written: each wave is
    committed once, and the generation commits with the source's rows."""
    import cdc_platform.model.rehydration as rehydration_rules

    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'b', g FROM generate_series(1, 40000) g")
    env.run_until_caught_up()
    env.configure_table("items", "snapshot: {chunk_rows: 1000, chunks_per_wave: 8}")  # 40 chunks, 5 waves
    home = tmp_path / "home"
    home.mkdir()
    instance = dg.DagsterInstance.local_temp(str(home))
    h, lake = Harness(env, instance), Lake(env.config, spark)
    request = h.expect("bootstrap")
    generation = request.partition_key
    assert generation is not None
    instance.add_dynamic_partitions(str(generations_partitions(h.table).name), [generation])
    process = h.daemon.launch(request, {"DAGSTER_HOME": str(home)})
    try:
        plan, written = when_half_written(lake, h.table.key, generation, process)
    finally:
        process.kill()
        process.wait()
    assert h.daemon.reap_dead_runs()  # run monitoring: the run's process is gone
    before = lake.wave_commits(h.table.key, generation)
    assert len(before) < len(plan.waves()) and lake.ledger.committed(h.table.key) is None
    monkeypatch.setattr(rehydration_rules, "RETRY_FIRST_S", 0.0)  # the pause before a retry, not waited out here
    resume = h.expect("bootstrap")
    assert resume.partition_key == generation and "resume" in str(resume.run_key)  # the same generation
    h.execute(resume)
    after = lake.wave_commits(h.table.key, generation)
    assert sorted(after) == [n for n, _ in plan.waves()] and after[: len(before)] == before  # no wave read twice
    assert set(written) <= set(range(len(plan.predicates)))
    committed = lake.ledger.committed(h.table.key)
    assert committed is not None and committed.generation == generation and committed.rows == 40_000
    assert h.current()
    _assert_current_equals_source(spark, h)
    assert not h.tick().run_requests


def test_a_generation_named_in_the_launchpad_is_ordered_by_when_it_was_taken(env: CaptureEnv, spark: Any) -> None:
    """Bug 4: any partition name works; the lake uses the generation taken last."""
    from cdc_platform.lake.ledger import Ledger

    _five_rows_captured(env)
    with dg.instance_for_test() as instance:
        h = Harness(env, instance)
        h.execute(h.expect("bootstrap"))
        assert h.current()
        with env.app() as app:
            app.execute("UPDATE items SET body = 'after' WHERE id = 1")
        # a person adds a partition in the launchpad and materializes it (no cdc tags)
        name = generations_partitions(h.table).name
        assert name is not None
        instance.add_dynamic_partitions(name, ["2026-rerun"])
        job = h.defs.resolve_job_def("cap__items__generation_job")
        assert job.execute_in_process(instance=instance, partition_key="2026-rerun").success
        committed = Ledger(h.config.lake.root).committed(h.table.key)
        assert committed is not None and committed.generation == "2026-rerun"
        result = h.tick()
        assert not result.run_requests and "in flight" not in str(result.skip_reason)
        assert h.current()
        position = Ledger(h.config.lake.root).current(h.table.key)
        assert position is not None and position.generation == "2026-rerun"
        _assert_current_equals_source(spark, h)
