"""The changelog sensor against a real Kafka topic and a real Dagster instance: it asks
for closed windows only, in order, from the generation's watermark, in bounded batches,
and never twice."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.definitions import build_definitions
from cdc_platform.factories.table import changelog_partitions, generations_partitions, snapshot_asset_key
from cdc_platform.sensors import MAX_WINDOWS_PER_TICK
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, ["CREATE TABLE items (id int PRIMARY KEY)"], ["items"]):
        env.configure_table("items", "changelog: {window: 1m, grace_s: 3600}")
        yield env


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def test_only_closed_windows_in_bounded_batches(env: CaptureEnv) -> None:
    config = env.config
    table = config.table(f"cap.{env.schema}.items")
    topic = config.topic_for(table)
    admin = AdminClient({"bootstrap.servers": env.profile.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)]).values():
        future.result(timeout=30)

    now = datetime.now(UTC)
    start = _minute(now) - timedelta(minutes=40)
    partitions_past_until = _minute(now) - timedelta(minutes=10)  # p0 and p1 stop here, p2 goes on
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    t = start
    while t <= now - timedelta(minutes=2):
        for partition in (0, 1, 2):
            if partition == 2 or t <= partitions_past_until:
                producer.produce(topic, b"{}", key=b"k", partition=partition, timestamp=int(t.timestamp() * 1000))
        t += timedelta(seconds=30)
    assert producer.flush(30) == 0

    with dg.instance_for_test() as instance:
        defs = build_definitions(config)
        # a generation with its watermark 30 s into the first minute
        name = generations_partitions(table).name
        assert name is not None
        instance.add_dynamic_partitions(name, ["g1"])
        taken_at = start + timedelta(seconds=30)
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=snapshot_asset_key(table),
                partition="g1",
                metadata={"watermark_taken_at": taken_at.isoformat(), "watermark_kafka_end_offsets": {"0": 0}},
            )
        )
        sensor = defs.resolve_sensor_def("changelog_windows")
        cursor = None
        requested: list[str] = []
        batches = []
        for _ in range(3):
            result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
            assert isinstance(result, dg.SensorResult)
            cursor = result.cursor
            keys = [r.partition_key for r in result.run_requests or []]
            batches.append(len(keys))
            requested += [k for k in keys if k is not None]

    partitions = changelog_partitions(table)
    windows = [partitions.time_window_for_partition_key(k) for k in requested]
    # from the window holding the watermark, contiguous, none twice
    assert windows[0].start == start
    assert all(a.end == b.start for a, b in itertools.pairwise(windows))
    assert len(set(requested)) == len(requested)
    # closed only: every partition has a record at or after the window end
    assert windows[-1].end <= partitions_past_until
    assert windows[-1].end == partitions_past_until  # …and every closed one was asked for
    # bounded batches while catching up, then nothing more
    assert batches == [MAX_WINDOWS_PER_TICK, len(requested) - MAX_WINDOWS_PER_TICK, 0]
