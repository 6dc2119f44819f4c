"""The checks on the real stack: a compatible schema change flows through to current;
completeness finds changelog holes and rows current lost, and names them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.checks import pandera_errors
from cdc_platform.lake.schema_registry import evaluate_schema
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.spark.test_current import assert_same_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    ddl = ["CREATE TABLE items (id int PRIMARY KEY, body text NOT NULL)"]
    for env in make_capture_env(demo_db, tmp_path, ddl, ["items"]):
        env.configure_table("items", "changelog: {grace_s: 0}")
        yield env


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _settle(env: CaptureEnv) -> datetime:
    env.run_until_caught_up()
    time.sleep(1.1)
    return _now()


def test_added_nullable_column_flows_through(env: CaptureEnv, spark: Any) -> None:
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    table = lake.table(key).config
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'b' || g FROM generate_series(1, 20) g")
    t0 = _settle(env) - timedelta(seconds=1)
    lake.snapshot(key, "g1")  # registers its schema as the baseline
    assert [h.version for h in lake.ledger.schema_history(key)] == [1]
    lake.current(key)

    with env.app() as app:
        app.execute("ALTER TABLE items ADD COLUMN note text")
        app.execute("INSERT INTO items VALUES (100, 'new', 'with a note')")
        app.execute("UPDATE items SET note = 'noted' WHERE id = 1")
    t1 = _settle(env)
    # the records carry a column the registered schema lacks: the source is asked, the
    # compatible change registered, and the window decoded with it
    assert lake.window(key, t0, t1).schema_registered
    assert [h.change for h in lake.ledger.schema_history(key)] == ["baseline of generation g1", "added note"]
    _, observed = lake.source(key).describe(table)
    report = evaluate_schema(lake.ledger, key, table.compatibility, "g1", observed)
    assert report.passed and report.version == 2 and not report.registered  # nothing new since
    lake.current(key)

    current = lake.read_current(key)
    assert {r["id"]: r["note"] for r in current.where("note IS NOT NULL").collect()} == {100: "with a note", 1: "noted"}
    assert_same_rows(lake.truth_rows(key), current.collect())
    # pandera, generated from the table's schema: body is NOT NULL in the source
    assert pandera_errors(current, {"body": False, "note": True}, ["id"]) == []
    broken = current.union(spark.createDataFrame([(999, None, None)], current.schema))
    assert any(e.startswith("body") for e in pandera_errors(broken, {"body": False, "note": True}, ["id"]))


def test_completeness_finds_holes_and_lost_rows(env: CaptureEnv, spark: Any) -> None:
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    edges = [_now() - timedelta(seconds=1)]
    for batch in range(3):  # three windows, each with its own changes
        with env.app() as app:
            app.execute(
                f"INSERT INTO items SELECT g, 'w{batch}' FROM generate_series({batch * 10 + 1}, {batch * 10 + 10}) g"
            )
        edges.append(_settle(env))
    for i in (0, 2):  # the middle window is not materialized: a hole
        lake.window(key, edges[i], edges[i + 1])
    lake.current(key)
    with env.running_capture():
        report = lake.completeness(key)
    assert not report.passed and report.holes and report.offsets_missing == 10
    # current stops at the hole: the keys after it are in flight, the rest is compared
    assert report.compared and (report.compared_rows, report.in_flight_keys) == (10, 20)

    lake.window(key, edges[1], edges[2])
    lake.current(key)
    with env.running_capture():
        report = lake.completeness(key)
        assert report.passed and report.compared, report.compare_note
        assert (report.source_rows, report.current_rows, report.compared_rows) == (30, 30, 30)
        # a row lost from current is found and named
        lake.replace_current(key, lambda current: current.where("id <> 7"))
        report = lake.completeness(key)
    assert not report.passed and report.compared and (report.missing, report.extra, report.differing) == (1, 0, 0)
    assert report.sample == ['missing {"id": 7}']
    # capture stopped and a change behind the slot: no process reads the slot, so the check
    # says so at once instead of waiting out its deadline for a confirmation nothing sends
    with env.app() as app:
        app.execute("UPDATE items SET body = 'after capture' WHERE id = 1")
    report = lake.completeness(key)
    assert not report.compared
    assert "read by no process" in report.compare_note and "is capture running?" in report.compare_note


def test_completeness_reaches_a_verdict_on_a_table_that_never_stops_changing(env: CaptureEnv, spark: Any) -> None:
    """Keys with changes in flight are left out, every other row is compared: a lost
    update (current keeps the row as it was before a change it applied) fails the check
    while the table is busy, and the topic counts as fed."""
    from pyspark.sql import functions as F

    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'v1' FROM generate_series(1, 200) g")
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    t0 = _now() - timedelta(seconds=1)
    with env.app() as app:
        app.execute("UPDATE items SET body = 'v2' WHERE id = 150")  # the update a lost-update bug drops
    with env.running_capture(), Churn(env, keys=100) as churn:
        time.sleep(3)
        t1 = _now()
        time.sleep(1.1)
        lake.window(key, t0, t1)
        lake.current(key)
        report = lake.completeness(key)
        assert report.passed and report.compared, report.compare_note
        assert report.in_flight_keys > 0 and report.compared_rows >= 100 and report.differing == 0
        lake.replace_current(
            key, lambda current: current.withColumn("body", F.when(F.col("id") == 150, "v1").otherwise(F.col("body")))
        )
        report = lake.completeness(key)
        assert churn.updates > 100  # it was busy all along
    assert not report.passed and report.compared, report.compare_note
    assert (report.missing, report.extra, report.differing) == (0, 0, 1)
    assert report.sample == ['differs {"id": 150}']
    # the source wrote rows and the topic got events since the first check: fed
    assert report.unfed == "" and report.source_changes and report.topic_events


class Churn(threading.Thread):
    """Updates keys 1..``keys`` in small transactions until the block ends."""

    def __init__(self, env: CaptureEnv, keys: int) -> None:
        super().__init__(daemon=True)
        self.env, self.keys, self.updates = env, keys, 0
        self._halt = threading.Event()

    def run(self) -> None:
        with self.env.app() as app:
            while not self._halt.is_set():
                row = (f"busy{self.updates}", 1 + self.updates % self.keys)
                app.execute("UPDATE items SET body = %s WHERE id = %s", row)
                self.updates += 1
                time.sleep(0.01)

    def __enter__(self) -> Churn:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._halt.set()
        self.join(timeout=30)


def test_keys_check_finds_foreign_kafka_keys(env: CaptureEnv, spark: Any) -> None:
    from confluent_kafka import Producer

    from cdc_platform.lake.checks import check_keys, recent_changelog

    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    env.run_until_caught_up()  # the slot exists before the changes
    lake.snapshot(key, "g1")  # the check reads the records since the committed generation's watermark
    t0 = _now() - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, 'k' || g FROM generate_series(1, 10) g")
    env.run_until_caught_up()
    [original] = [m for m in env.consume(["items"]) if m.value and m.envelope["after"]["id"] == 5]
    # another producer keys the same row differently (an extra field): not the primary key,
    # and not the same bytes as capture's key for that row
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    producer.produce(env.topic("items"), original.value, key=b'{"id": 5, "tenant": 1}', partition=original.partition)
    assert producer.flush(10) == 0
    time.sleep(1.1)
    lake.window(key, t0, _now())
    lake.current(key)
    current = spark.read.format("delta").load(lake.table(key).current_path)
    report = check_keys(current, recent_changelog(spark, lake.ledger, lake.table(key)), ["id"])
    assert (report.null_keys, report.duplicate_keys) == (0, 0)
    assert report.kafka_events_checked == 11
    assert (report.kafka_key_mismatches, report.kafka_unstable_rows) == (1, 1)
    assert any('"tenant":1' in s for s in report.kafka_sample) and not report.passed
    # the other producer stopped, the user rehydrates (the description's fix): the new
    # generation's current is built from none of those records, and the check starts afresh
    lake.snapshot(key, "g2")
    lake.current(key)
    current = spark.read.format("delta").load(lake.table(key).current_path)
    again = check_keys(current, recent_changelog(spark, lake.ledger, lake.table(key)), ["id"])
    assert again.kafka_events_checked == 0 and again.passed, again
