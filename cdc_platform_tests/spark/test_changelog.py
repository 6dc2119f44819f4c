"""Changelog windows on the real stack: fixed offset ranges, idempotent, no holes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from cdc_platform.spark.changelog import (
    DeadLetterError,
    WindowNotClosedError,
    changelog_path,
    dead_letters_path,
    materialize_window,
)
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
    config = env.config
    table = config.table(f"cap.{env.schema}.items")
    env.run_until_caught_up()
    t0 = _now() - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO items SELECT g, g * 1.25, 'n' || g, now() FROM generate_series(1, 40) g")
        app.execute("UPDATE items SET price = price + 1 WHERE id <= 10")
        app.execute("DELETE FROM items WHERE id > 35")
    env.run_until_caught_up()
    time.sleep(1.2)
    t1 = _now()

    with pytest.raises(WindowNotClosedError, match="is open"):  # a window that has not ended yet
        materialize_window(spark, config, table, t1, t1 + timedelta(hours=1))

    first = materialize_window(spark, config, table, t0, t1)
    assert first.events == {"c": 40, "u": 10, "d": 5, "tombstone": 5}
    assert not first.reused_ranges
    changelog = spark.read.format("delta").load(changelog_path(config, table))
    before = sorted(tuple(r) for r in changelog.select("kafka_partition", "kafka_offset", "op").collect())

    again = materialize_window(spark, config, table, t0, t1)  # re-running gives the same rows
    assert again.reused_ranges and again.ranges == first.ranges
    after = sorted(tuple(r) for r in spark.read.format("delta").load(changelog_path(config, table)).select(
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
    second = materialize_window(spark, config, table, t1, _now())
    assert second.dead_letters == 1 and second.events.get("u") == 1
    dead = spark.read.format("delta").load(dead_letters_path(config, table)).collect()
    assert [(r["kafka_partition"], r["raw_value"]) for r in dead] == [(0, b"not json at all")]
    assert "value is not JSON" in dead[0]["error"]
    # contiguous: each partition's second range starts exactly where the first ended
    assert [r.start for r in second.ranges] == [r.end for r in first.ranges]


def test_errors_tolerance_none_stops_without_writing(env: CaptureEnv, spark: Any) -> None:
    config = env.config
    table = config.table(f"cap.{env.schema}.items")
    env.run_until_caught_up()
    t0 = _now() - timedelta(seconds=1)
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    producer.produce(env.topic("items"), key=b'{"id":1}', value=b'{"op":"c"}', partition=1)
    assert producer.flush(10) == 0
    time.sleep(1.2)
    with pytest.raises(DeadLetterError, match=r"errors\.tolerance is 'none', so nothing was written"):
        materialize_window(spark, config.model_copy(), table.model_copy(
            update={"changelog": table.changelog.model_copy(update={"grace_s": 0.0})}), t0, _now())  # fmt: skip
