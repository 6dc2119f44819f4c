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

from cdc_platform.definitions import build_definitions
from cdc_platform.factories.table import (
    KEYS_CHECK,
    SCHEMA_CHECK,
    current_asset_key,
    generations_partitions,
    snapshot_asset_key,
)
from cdc_platform.orchestration import apply_current
from cdc_platform.spark.changelog import materialize_window
from cdc_platform.spark.current import current_path
from cdc_platform.spark.snapshot import take_snapshot
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.polling_env import PollingEnv

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
    rehydration sensor evaluated tick by tick with its cursor carried over."""

    def __init__(self, env: CaptureEnv | PollingEnv, instance: dg.DagsterInstance, table_key: str = "") -> None:
        self.env, self.instance = env, instance
        self.config = env.config
        self.table = self.config.table(table_key or f"cap.{getattr(env, 'schema', '')}.items")
        self.defs = build_definitions(self.config)
        self.cursor: str | None = None

    def tick(self) -> dg.SensorResult:
        sensor = self.defs.resolve_sensor_def("rehydration")
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs)
        result = sensor(context)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor
        return result

    def expect(self, reason: str) -> dg.RunRequest:
        result = self.tick()
        assert [r.tags["cdc/reason"] for r in result.run_requests or []] == [reason], result
        [request] = result.run_requests or []
        return request

    def execute(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        """What the daemon does with the request: add the partition, run the job."""
        name = generations_partitions(self.table).name
        assert name is not None and request.partition_key is not None and request.job_name is not None
        self.instance.add_dynamic_partitions(name, [request.partition_key])
        job = self.defs.resolve_job_def(request.job_name)
        result = job.execute_in_process(instance=self.instance, partition_key=request.partition_key, tags=request.tags)
        assert result.success
        return result

    def current(self) -> bool:
        [(_, success, _)] = apply_current(self.config, [self.table], self.instance)
        return success

    def check_passed(self, name: str) -> bool:
        key = dg.AssetCheckKey(current_asset_key(self.table), name)
        record = self.instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        return bool(record.status.value == "SUCCEEDED")


def _assert_current_equals_source(spark: Any, harness: Harness, root: Path) -> None:
    config = harness.config
    verify = config.model_copy(update={"lake": config.lake.model_copy(update={"root": str(root)})})
    truth = spark.read.format("delta").load(take_snapshot(spark, verify, harness.table, "truth").path)
    current = spark.read.format("delta").load(current_path(config, harness.table)).drop("_cdc_commit_lsn", "_cdc_lsn")
    assert (truth.exceptAll(current).count(), current.exceptAll(truth).count()) == (0, 0)


def test_each_trigger_starts_one_generation_and_current_follows(env: CaptureEnv, spark: Any, tmp_path: Path) -> None:
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
        records = instance.fetch_materializations(snapshot_asset_key(h.table), limit=1).records
        materialization = records[0].asset_materialization
        assert materialization is not None
        assert materialization.metadata["rehydration_reason"].value == "manual"
        assert not h.tick().run_requests

        # Kafka retention removed offsets the changelog still needs (a window was recorded
        # before, so the next window would start inside the hole)
        time.sleep(1.1)
        t_window = datetime.now(UTC).replace(microsecond=0)
        materialize_window(spark, h.config, h.table, t_start, t_window)
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
        materialize_window(spark, h.config, h.table, t_window, datetime.now(UTC).replace(microsecond=0))
        assert h.current()
        _assert_current_equals_source(spark, h, tmp_path / "verify_gap")
        assert not h.tick().run_requests

        # the current table is deleted
        shutil.rmtree(current_path(h.config, h.table))
        h.execute(h.expect("current_missing"))
        assert h.current()
        _assert_current_equals_source(spark, h, tmp_path / "verify_missing")

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
        frame = spark.read.format("delta").load(current_path(h.config, h.table))
        frame.limit(1).write.format("delta").mode("append").save(current_path(h.config, h.table))
        from cdc_platform.spark.checks import check_keys

        report = check_keys(spark, spark.read.format("delta").load(current_path(h.config, h.table)), None, ["id"])
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
            _assert_current_equals_source(spark, h, tmp_path / f"verify_{offending[:3]}")
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
