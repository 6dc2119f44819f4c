"""The lake on topics written by a real Debezium PostgreSQL connector (Kafka Connect 4.2.0,
debezium-connector-postgres 3.5.0.Final from Maven Central), unchanged: the platform takes
its own generations, Debezium streams (``snapshot.mode=no_data``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.model.errors import FatalError
from cdc_platform.sources import CaptureSettings
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.debezium_env import DebeziumProducer, debezium_producing
from cdc_platform_tests.integration.test_capture_faults import DDL, Workload
from cdc_platform_tests.spark.test_current import assert_current_equals_source

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"])


def test_the_first_update_after_a_generation_reaches_current(env: CaptureEnv, connect: Any, spark: Any) -> None:
    """Debezium's source.sequence[0] is the *previous* transaction's commit LSN: on a quiet
    table it lies before the generation's watermark although the update came after it.
    The update must still reach current (it was silently dropped)."""
    env.configure_table("items", "changelog: {grace_s: 0}")
    key = f"cap.{env.schema}.items"
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    # no heartbeat query: nothing commits between the generation and the update
    with debezium_producing(env, connect, **{"heartbeat.action.query": None}) as producer:
        lake = Lake(env.config, spark)  # the config now names the producer
        with env.app() as app:
            app.execute("INSERT INTO items (id, body) SELECT g, 'v1' FROM generate_series(1, 20) g")
        producer.wait_for_events(20)
        lake.snapshot(key, "g1")
        with env.app() as app:
            app.execute("UPDATE items SET body = 'v2', qty = 7 WHERE id = 5")
        update = [m for m in producer.wait_for_events(21) if m.envelope["op"] == "u"]
        assert len(update) == 1
        commit_before, _ = update[0].order[:2]
        generation = lake.ledger.committed(key)
        assert generation is not None and generation.watermark is not None
        assert commit_before <= generation.watermark.position  # the case: sequence[0] is not after it
    time.sleep(1.1)
    lake.window(key, t0, datetime.now(UTC).replace(microsecond=0))
    applied = lake.current(key)
    assert applied.changes_applied == 1
    row = lake.read_current(key).where("id = 5").collect()
    assert [(r["body"], r["qty"]) for r in row] == [("v2", 7)]

    # the connector is gone: advice names it and its slot, never the platform's capture
    advice = lake.source(key).wait_until_captured(2**62, deadline=0)
    assert f"Debezium connector 'dbz-{env.prefix}'" in advice and "heartbeat.action.query" in advice
    assert "cdc-platform capture run" not in advice
    with pytest.raises(FatalError, match="Debezium"):
        lake.source(key).capture(CaptureSettings(until_caught_up=True))


@pytest.mark.parametrize("schemas", [False, True], ids=["json", "json-with-schemas"])
def test_current_equals_source_with_debezium_as_the_producer(
    env: CaptureEnv, connect: Any, spark: Any, schemas: bool
) -> None:
    """The equivalence bar with Debezium producing: a mixed workload (deletes, key changes,
    multi-table transactions, TOAST-only updates, a truncate), a generation taken while it
    runs, windows out of order, then a second generation; current equals the source."""
    for t in ("items", "lines"):
        env.configure_table(t, "changelog: {grace_s: 0}")
    keys = [f"cap.{env.schema}.{t}" for t in ("items", "lines")]
    with env.app() as app:  # TOASTed bodies: updates of qty alone leave them unavailable
        app.execute(
            "INSERT INTO items (id, body) SELECT g, (SELECT string_agg(md5(g::text || i::text), '')"
            " FROM generate_series(1, 200) i) FROM generate_series(-50, -1) g"
        )
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with debezium_producing(env, connect, schemas=schemas) as producer:
        lake = Lake(env.config, spark)  # the config now names the producer
        workload = Workload(env, seconds=None, seed=5)
        workload.start()
        workload.wait_for(40)
        for key in keys:
            lake.snapshot(key, "g1")
        with env.app() as app:
            app.execute("UPDATE items SET qty = qty + 100 WHERE id < 0")  # TOAST-only updates
            app.execute("TRUNCATE lines")
        workload.wait_for(40)
        workload.stop()
        assert workload.error is None
        producer.wait_caught_up()
        _assert_toast_placeholders_seen(producer)
        time.sleep(1.1)
        t_end = datetime.now(UTC).replace(microsecond=0)
        # windows out of order (one window with schemas: the decoding is what differs there)
        count = 1 if schemas else 3
        size = (t_end - t0) / count
        windows = [(t0 + i * size, t0 + (i + 1) * size) for i in range(count)]
        applied = {}
        for key in keys:
            for i in reversed(range(count)):
                lake.window(key, *windows[i])
            applied[key] = lake.current(key)
            assert applied[key].generation == "g1"
        assert_current_equals_source(lake, keys, at_least=20)

        # busy again: the completeness check still reaches a verdict, with nothing amiss
        workload = Workload(env, seconds=None, seed=6, first_id=100_000)
        workload.start()
        workload.wait_for(30)
        for key in keys:
            report = lake.completeness(key)
            assert report.passed and report.compared, (key, report.compare_note, report.sample, report.unfed)
            assert report.compared_rows >= 20 and report.in_flight_keys > 0
            print(
                f"[figures] {key} ({'json+schemas' if schemas else 'json'}): rows compared {report.compared_rows}, "
                f"keys in flight {report.in_flight_keys}, missing {report.missing}, extra {report.extra}, "
                f"differing {report.differing}"
            )
        if schemas:
            workload.stop()
            return

        # a second generation while the workload runs: rebuilt from it, then replayed
        for key in keys:
            lake.snapshot(key, "g2")
        workload.wait_for(30)
        workload.stop()
        producer.wait_caught_up()
        time.sleep(1.1)
    t_next = datetime.now(UTC).replace(microsecond=0)
    for key in keys:
        lake.window(key, t_end, t_next)
        assert lake.current(key).rebuilt
    assert_current_equals_source(lake, keys, at_least=20)


def _assert_toast_placeholders_seen(producer: DebeziumProducer) -> None:
    events = [m for m in producer.messages() if m.value is not None and m.envelope["op"] == "u"]
    toasted = [m for m in events if (m.envelope.get("after") or {}).get("body") == "__debezium_unavailable_value"]
    assert toasted, "the workload made no TOAST-only update (nothing tested the placeholder)"


def test_a_table_the_connector_leaves_out_fails_completeness(env: CaptureEnv, connect: Any, spark: Any) -> None:
    """lines is configured in the lake but not in the connector's table.include.list: its
    topic stays empty while the table changes. The completeness check says so, and why."""
    key = f"cap.{env.schema}.lines"
    with debezium_producing(env, connect, **{"table.include.list": f"{env.schema}.items"}) as producer:
        lake = Lake(env.config, spark)
        with env.app() as app:
            app.execute("INSERT INTO lines SELECT g, 1, 'n' FROM generate_series(1, 5) g")
        lake.snapshot(key, "g1")
        lake.current(key)
        first = lake.completeness(key)  # the first reading of the feed: nothing to judge yet
        assert first.passed and first.compared and first.source_changes is None, first.compare_note
        with env.app() as app:
            app.execute("INSERT INTO lines SELECT g, 2, 'n' FROM generate_series(1, 7) g")
            app.execute("UPDATE lines SET note = 'm' WHERE line_no = 1")
            app.execute("INSERT INTO items (id, body) VALUES (1, 'fed')")  # the included table is fed
        producer.wait_for_events(1)
        producer.wait_caught_up()
        report = lake.completeness(key)
        again = lake.completeness(key)  # an unfed reading is not the new baseline
    assert not report.passed and (report.source_changes, report.topic_events) == (12, 0)
    assert f"topic {env.topic('lines')} is not fed" in report.unfed
    assert f"does not capture {env.schema}.lines" in report.unfed and "table.include.list" in report.unfed
    # and the rows it never received are found missing or differing
    assert report.compared and (report.missing, report.differing) == (7, 5), report.compare_note
    assert not again.passed and again.unfed
