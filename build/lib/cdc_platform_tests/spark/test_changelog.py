"""Changelog windows on the real stack: fixed offset ranges, idempotent, no holes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from cdc_platform.devtools.lake import Lake
from cdc_platform.model.errors import DeadLetterError, NoGenerationError, WindowNotClosedError
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    ddl = ["CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2), note text, seen timestamptz)"]
    yield from make_capture_env(demo_db, tmp_path, ddl, ["items"], table_yaml="")


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_windows_are_fixed_once_idempotent_and_contiguous(env: CaptureEnv, spark: Any) -> None:
    env.configure_table("items", "changelog: {grace_s: 0}")
    env.configure_table("items", "errors: {tolerance: all}")
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    env.run_until_caught_up()
    t0 = _now() - timedelta(seconds=1)
    with pytest.raises(NoGenerationError, match="no registered schema"):  # decoding needs a generation's schema
        lake.window(key, t0, t0 + timedelta(seconds=1))
    lake.snapshot(key, "g1")
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, g * 1.25, 'n' || g, now() FROM generate_series(1, 40) g")
        app.execute("UPDATE items SET price = price + 1 WHERE id <= 10")
        app.execute("DELETE FROM items WHERE id > 35")
    env.run_until_caught_up()
    time.sleep(1.2)
    t1 = _now()

    with pytest.raises(WindowNotClosedError, match="is open"):  # a window that has not ended yet
        lake.window(key, t1, t1 + timedelta(hours=1))

    first = lake.window(key, t0, t1)
    assert first.events == {"c": 40, "u": 10, "d": 5, "tombstone": 5}
    assert not first.reused_ranges
    changelog = spark.read.format("delta").load(lake.table(key).changelog_path)
    before = sorted(tuple(r) for r in changelog.select("kafka_partition", "kafka_offset", "op").collect())

    again = lake.window(key, t0, t1)  # re-running gives the same rows
    assert again.reused_ranges and again.ranges == first.ranges
    after = sorted(tuple(r) for r in spark.read.format("delta").load(lake.table(key).changelog_path).select(
        "kafka_partition", "kafka_offset", "op").collect())  # fmt: skip
    assert after == before

    # a record that cannot be decoded goes to the dead-letter table with its reason
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    producer.produce(env.topic("items"), key=b'{"id":999}', value=b"not json at all", partition=0)
    with env.app() as app:
        app.execute("UPDATE items SET note = 'later' WHERE id = 1")
    env.run_until_caught_up()
    assert producer.flush(10) == 0
    time.sleep(1.2)
    # the next window, of any size: neighbours are found by recorded boundaries
    second = lake.window(key, t1, _now())
    assert second.dead_letters == 1 and second.events.get("u") == 1
    dead = spark.read.format("delta").load(lake.table(key).dead_letters_path).collect()
    assert [(r["kafka_partition"], r["raw_value"]) for r in dead] == [(0, b"not json at all")]
    assert "value is not JSON" in dead[0]["error"]
    # contiguous: each partition's second range starts exactly where the first ended
    assert [r.start for r in second.ranges] == [r.end for r in first.ranges]


def test_errors_tolerance_none_stops_without_writing(env: CaptureEnv, spark: Any) -> None:
    env.configure_table("items", "changelog: {grace_s: 0}")
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.items"
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    t0 = _now() - timedelta(seconds=1)
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    producer.produce(env.topic("items"), key=b'{"id":1}', value=b'{"op":"c"}', partition=1)
    assert producer.flush(10) == 0
    time.sleep(1.2)
    with pytest.raises(DeadLetterError, match=r"errors\.tolerance is 'none', so nothing was written"):
        lake.window(key, t0, _now())
    assert not lake.ledger.windows(key)  # nothing recorded either: the window is retried after the fix


def test_the_lake_side_needs_no_source_connection(env: CaptureEnv, spark: Any) -> None:
    """Bug 8: records already in Kafka are materialized and applied with the source down:
    the schema comes from the ledger, not from the source."""
    env.configure_table("items", "changelog: {grace_s: 0}")
    key = f"cap.{env.schema}.items"
    env.run_until_caught_up()
    Lake(env.config, spark).snapshot(key, "g1")
    t0 = _now() - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, g * 1.5, 'n', now() FROM generate_series(1, 5) g")
    env.run_until_caught_up()
    time.sleep(1.1)
    config = env.config
    down = config.model_copy(update={"sources": {"cap": config.sources["cap"].model_copy(update={"port": 1})}})
    lake = Lake(down, spark)  # the source is unreachable from here on
    assert lake.window(key, t0, _now()).events == {"c": 5}
    assert lake.current(key).rows == 5
