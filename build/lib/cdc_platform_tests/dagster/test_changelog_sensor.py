"""The changelog sensor against a real Kafka topic, a real ledger and a real Dagster
instance: it asks for closed windows only, in order, from the committed generation's
watermark, in bounded batches; never for a window recorded or being materialized; and
again (with a new run key) for a window whose run failed or was killed."""

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

from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
from cdc_platform.model.windows import WindowPlan, WindowRange, window_key
from cdc_platform.orchestration.definitions import build_definitions
from cdc_platform.orchestration.keys import TAG_TABLE, changelog_asset_key, changelog_job_name
from cdc_platform.orchestration.partitions import changelog_partitions
from cdc_platform.orchestration.sensors.changelog import MAX_WINDOWS_PER_TICK
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, ["CREATE TABLE items (id int PRIMARY KEY)"], ["items"]):
        env.configure_table("items", "changelog: {window: 1m, grace_s: 3600}")
        yield env


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance) -> list[dg.RunRequest]:
    sensor = defs.resolve_sensor_def("changelog_windows")
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources))
    assert isinstance(result, dg.SensorResult)
    return list(result.run_requests or [])


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

    # a committed generation with its watermark 30 s into the first minute
    ledger = Ledger(config.lake.root)
    watermark = Watermark(1, {0: 0, 1: 0, 2: 0}, start + timedelta(seconds=30))
    ledger.record_generation(GenerationEvent(table.key, "g1", GenerationStatus.COMMITTED, watermark=watermark))
    partitions = changelog_partitions(table)
    with dg.instance_for_test() as instance:
        defs = build_definitions(env.config_path)
        requested: list[str] = []
        batches = []
        for _ in range(3):
            keys = [r.partition_key for r in _tick(defs, instance) if r.partition_key is not None]
            batches.append(len(keys))
            requested += keys
            for key in keys:  # the runs materialize their windows: the ledger records them
                window = partitions.time_window_for_partition_key(key)
                ranges = (WindowRange(0, 0, 0, window_key(window.end)),)
                ledger.record_window(table.key, WindowPlan(window_key(window.start), ranges, reused=False))

        windows = [partitions.time_window_for_partition_key(k) for k in requested]
        # from the window holding the watermark, contiguous, none twice
        assert windows[0].start == start
        assert all(a.end == b.start for a, b in itertools.pairwise(windows))
        assert len(set(requested)) == len(requested)
        # closed only: every partition has a record at or after the window end
        assert windows[-1].end == partitions_past_until  # …and every closed one was asked for
        # bounded batches while catching up, then nothing more
        assert batches == [MAX_WINDOWS_PER_TICK, len(requested) - MAX_WINDOWS_PER_TICK, 0]

        # a window whose run died is asked for again, under a new run key; one still
        # queued or running is not asked for twice — whether the run came from the sensor
        # (a job run: no asset selection) or from the launchpad (an asset selection)
        missing = requested[5]
        window = partitions.time_window_for_partition_key(missing)
        _forget(ledger, table.key, window_key(window.start))
        job = defs.resolve_job_def(changelog_job_name(table))
        tags = {TAG_TABLE: table.key, "dagster/partition": missing}
        queued = instance.create_run_for_job(job, status=dg.DagsterRunStatus.NOT_STARTED, tags=tags)
        assert _tick(defs, instance) == []
        instance.report_run_canceled(queued)
        selection = {changelog_asset_key(table)}
        running = instance.create_run_for_job(
            job, status=dg.DagsterRunStatus.STARTED, tags=tags, asset_selection=selection
        )
        assert _tick(defs, instance) == []
        instance.report_run_failed(running, "killed")
        [again] = _tick(defs, instance)
        assert again.partition_key == missing and again.run_key == f"{table.key}:{missing}:3"


def _forget(ledger: Ledger, table: str, key: str) -> None:
    """Remove one recorded window (as if its run had been killed before recording it)."""
    from deltalake import DeltaTable

    DeltaTable(f"{ledger.root}/windows").delete(f"\"table\" = '{table}' AND \"window\" = '{key}'")
