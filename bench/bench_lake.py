"""Snapshot and changelog throughput against their floors, measured in the same run.

* snapshot: rows/s of a generation into Delta (consistent parallel Spark JDBC read) vs
  ``COPY (SELECT …) TO STDOUT`` of the same table read to nowhere (the floor);
* changelog: events/s of one window decoded into Delta vs a plain confluent-kafka
  consume of the same offsets (the floor): decoded in the JVM (``apply.decoder: jvm``,
  Spark's Kafka source and Spark SQL) and in Python workers (``python``); and the same
  offsets read (not decoded) by Spark's own Kafka source;
* stream apply: events/s of the same changes applied by ``cdc-platform apply``'s engine
  (changelog append and merge into current, ``AvailableNow``) vs the same floor: the
  engine's first batch (cold). ``bench_apply_tables.py`` measures a warm batch too, and
  ten tables.

The table (``bench_lake_rows``: bigint key, numeric, text, timestamptz, jsonb) lives in
the dev stack's shop database; its changes come from the platform's own capture.

Run: make bench   (or .venv/bin/python bench/bench_lake.py [--rows 1000000 --changes 200000])
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
from confluent_kafka import TopicPartition

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.config.model import ApplyConfig, ApplyEngine, TableConfig
from cdc_platform.devtools.demo.setup import setup_demo
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile, stack_up
from cdc_platform.devtools.stack.postgres import LocalPostgres
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.devtools.stack.stack import load_stack_env
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.apply import StreamApply
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.tables import LakeTable, lake_table
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import WindowRange
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.postgres.slot import drop_slot

TABLE = "bench_lake_rows"


def prepare(
    rows: int, tag: str, changelog: dict[str, object] | None = None, tables: Sequence[str] | None = None
) -> PlatformConfig:
    """``rows``-row tables (``TABLE`` unless ``tables`` names others) in the dev stack with
    their own publication, slot and topic prefix (``tag``), and a config holding just them."""
    names = list(tables or [TABLE])
    prof = profile("dev")
    stack_up(prof)
    load_stack_env(prof)
    list(setup_demo(prof))
    with app_connect(prof) as app:
        for name in names:
            app.execute(f"DROP TABLE IF EXISTS {name}")
            app.execute(
                f"""CREATE TABLE {name} (id bigint PRIMARY KEY, amount numeric(12,2), label text,
                                        at timestamptz, doc jsonb)"""
            )
            app.execute(
                f"""INSERT INTO {name} SELECT g, (g %% 100000) / 100.0, md5(g::text), now() - g * interval '1 s',
                           jsonb_build_object('g', g, 'tag', 'x') FROM generate_series(1, %s) g""",
                (rows,),
            )
        app.execute(f"CREATE PUBLICATION bench_{tag} FOR TABLE {', '.join(names)}")
        app.commit()
        # the load's hint bits and visibility map set now, not by an autovacuum that lands on
        # whichever measurement runs next (the COPY floor moved 6.5-9.5 s between runs)
        app.autocommit = True
        for name in names:
            app.execute(f"VACUUM (ANALYZE) {name}")
    base = load_config(REPO_ROOT / "cdc_platform.yaml")
    shop = base.sources["shop"].model_copy(
        update={"slot_name": f"bench_{tag}", "publication": f"bench_{tag}", "topic_prefix": f"bench{tag}"}
    )
    lake = base.lake.model_copy(update={"root": tempfile.mkdtemp(prefix="bench_lake_")})
    settings = changelog or {"grace_s": 0}
    configured = [TableConfig(name=f"shop.public.{name}", changelog=settings) for name in names]  # type: ignore[arg-type]
    return base.model_copy(update={"sources": {"shop": shop}, "tables": configured, "lake": lake})


def cleanup(config: PlatformConfig, tag: str, tables: Sequence[str] | None = None) -> None:
    """Remove what ``prepare`` made: the slot (a forgotten one pins WAL), publication, its
    tables (``TABLE`` unless ``tables`` names them: the config may hold others, such as the
    demo's, which stay) and topics. Ends a capture still holding the slot first."""
    with LocalPostgres(profile("dev")).admin_connect("shop") as admin:
        drop_slot(admin, f"bench_{tag}", terminate_user=True)
        time.sleep(1.0)  # the terminated backend lets go of the slot
        drop_slot(admin, f"bench_{tag}")
        admin.execute(f"DROP PUBLICATION IF EXISTS bench_{tag}")
        for name in tables or [TABLE]:
            admin.execute(f"DROP TABLE IF EXISTS {name}")
    admin_client = KafkaClients(config.kafka).admin()
    doomed = [t for t in admin_client.list_topics(timeout=10).topics if f"bench{tag}" in t]
    for future in admin_client.delete_topics(doomed).values() if doomed else []:
        future.result(timeout=30)


def captured_updates(config: PlatformConfig, spark: object) -> tuple[LakeTable, TableSchema]:
    """The prepared table generated once (which registers its schema), then every row
    updated once and captured: its topic holds one update per row, for the decode benches."""
    lake = Lake(config, spark)
    key = config.tables[0].key
    lake.snapshot(key, "g1")
    settings = CaptureSettings(until_caught_up=True, status_interval_s=3600)
    open_source(config, "shop").capture(settings).run()
    with app_connect(profile("dev")) as app:
        app.execute(f"UPDATE {TABLE} SET amount = amount + 1")
    open_source(config, "shop").capture(settings).run()
    schema = lake.ledger.latest_schema(key)
    assert schema is not None
    return lake.table(key), schema


def copy_floor(config: PlatformConfig) -> tuple[int, float]:
    started = time.perf_counter()
    size = 0
    with (
        psycopg.connect(config.sources["shop"].conninfo("shop", "bench_copy")) as conn,
        conn.cursor() as cur,
        cur.copy(f"COPY (SELECT * FROM {TABLE}) TO STDOUT") as copy,
    ):
        for block in copy:
            size += len(block)
    return size, time.perf_counter() - started


def consume_floor(config: PlatformConfig, table: TableConfig, ranges: list[WindowRange]) -> tuple[int, float]:
    topic = config.topic_for(table)
    consumer = KafkaClients(config.kafka).consumer("bench_floor")
    started = time.perf_counter()
    count = 0
    consumer.assign([TopicPartition(topic, r.partition, r.start) for r in ranges if r.end > r.start])
    remaining = {r.partition: r.end for r in ranges if r.end > r.start}
    while remaining:
        for msg in consumer.consume(10_000, timeout=5):
            if msg.error() or msg.partition() not in remaining:
                continue
            count += 1
            if msg.offset() + 1 >= remaining[msg.partition()]:
                del remaining[msg.partition()]
    elapsed = time.perf_counter() - started
    consumer.close()
    return count, elapsed


def jvm_read(spark: object, config: PlatformConfig, table: TableConfig, ranges: list[WindowRange]) -> tuple[int, float]:
    """The same offsets read by Spark's own Kafka source (in the JVM, no decoding): what
    the streaming apply starts from (issue 16)."""
    topic = config.topic_for(table)
    spans = [r for r in ranges if r.end > r.start]
    starting = json.dumps({topic: {str(r.partition): r.start for r in spans}})
    ending = json.dumps({topic: {str(r.partition): r.end for r in spans}})
    started = time.perf_counter()
    row = (
        spark.read.format("kafka")  # type: ignore[attr-defined]
        .option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load()
        .selectExpr("count(*) AS n", "sum(length(value)) AS bytes")
        .first()
    )
    return int(row["n"]), time.perf_counter() - started


def with_decoder(config: PlatformConfig, decoder: str, lake_root: str | None = None) -> PlatformConfig:
    """The same tables, another ``apply.decoder`` (and lake root)."""
    shop = config.sources["shop"]
    shop = shop.model_copy(update={"apply": shop.apply.model_copy(update={"decoder": decoder})})
    lake = config.lake.model_copy(update={"root": lake_root}) if lake_root else config.lake
    return config.model_copy(update={"sources": {"shop": shop}, "lake": lake})


def stream_apply(lake: Lake, config: PlatformConfig) -> tuple[int, float]:
    """Everything available applied by the stream engine (changelog + current)."""
    tables = [lake_table(config, t) for t in config.tables]
    settings = ApplyConfig(engine=ApplyEngine.STREAM)
    started = time.perf_counter()
    with StreamApply(lake.spark, lake.ledger, lake.kafka, tables, settings) as engine:
        applied = engine.run_until_caught_up()
    events = sum(a.changelog.rows for a in applied if a.changelog is not None)
    return events, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = with_decoder(prepare(args.rows, tag), "jvm")
    table = config.tables[0]
    lake = Lake(config, get_spark_session(config.spark.model_copy(update={"master": "local[*]"})))
    python_lake = Lake(with_decoder(config, "python"), lake.spark)
    streamed = with_decoder(config, "jvm", tempfile.mkdtemp(prefix="bench_stream_"))
    stream_lake = Lake(streamed, lake.spark)
    settings = CaptureSettings(until_caught_up=True, status_interval_s=3600)
    m: dict[str, float] = {}
    try:
        lake.snapshot(table.key, "warmup")  # JVM, JDBC and Delta paths warm
        m["copy_bytes"], m["copy_s"] = copy_floor(config)
        started = time.perf_counter()
        result = lake.snapshot(table.key, "g1")
        m["snapshot_s"], m["snapshot_rows"] = time.perf_counter() - started, result.rows
        m["partitions"] = result.spark_partitions
        stream_lake.snapshot(table.key, "g1")  # the stream apply's own lake, from before the changes

        open_source(config, "shop").capture(settings).run()  # slot and topic exist before the changes
        t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        with app_connect(profile("dev")) as app:
            app.execute(f"UPDATE {TABLE} SET amount = amount + 1 WHERE id <= %s", (args.changes,))
        open_source(config, "shop").capture(settings).run()
        time.sleep(1.1)
        t1 = datetime.now(UTC).replace(microsecond=0)
        m["cold_s"] = timed(lambda: lake.window(table.key, t0, t1))  # first workers, first Delta commit
        window = lake.window(table.key, t0, t1)
        m["events"] = window.rows
        m["changelog_s"] = timed(lambda: lake.window(table.key, t0, t1))  # the same window again (idempotent)
        m["python_s"] = timed(lambda: python_lake.window(table.key, t0, t1))  # decoded in Python workers
        m["streamed"], m["stream_s"] = stream_apply(stream_lake, streamed)
        m["consumed"], m["consume_s"] = consume_floor(config, table, window.ranges)
        jvm_read(lake.spark, config, table, window.ranges)  # warm: the Kafka source's first classes and consumers
        m["jvm_count"], m["jvm_s"] = jvm_read(lake.spark, config, table, window.ranges)
    finally:
        cleanup(config, tag)
    report(m)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def report(m: dict[str, float]) -> None:
    rows, events = m["snapshot_rows"], m["events"]
    print(f"\nsnapshot of {rows:.0f} rows (same run; floor = COPY TO STDOUT of the same table)")
    print(
        f"  COPY {m['copy_s']:6.2f} s ({rows / m['copy_s']:9.0f} rows/s, {m['copy_bytes'] / 1e6:.0f} MB)   "
        f"snapshot into Delta {m['snapshot_s']:6.2f} s ({rows / m['snapshot_s']:9.0f} rows/s, "
        f"{m['partitions']:.0f} partitions)   ratio snapshot/floor = {m['copy_s'] / m['snapshot_s']:.3f}"
    )
    print(f"changelog window of {events:.0f} events (floor = plain confluent-kafka consume of the same offsets)")
    floor = m["consumed"] / m["consume_s"]
    print(
        f"  consume {m['consume_s']:6.2f} s ({floor:9.0f} ev/s)   window into Delta, decoded in the JVM "
        f"{m['changelog_s']:6.2f} s ({events / m['changelog_s']:9.0f} ev/s)   "
        f"ratio changelog/floor = {events / m['changelog_s'] / floor:.3f}"
    )
    print(
        f"  decoded in Python workers instead {m['python_s']:6.2f} s ({events / m['python_s']:9.0f} ev/s)   "
        f"ratio python/floor = {events / m['python_s'] / floor:.3f}   jvm/python = "
        f"{m['python_s'] / m['changelog_s']:.2f}x"
    )
    print(f"  (first run of the window, cold workers and table creation: {m['cold_s']:.2f} s)")
    apply_rate = m["streamed"] / m["stream_s"]
    print(
        f"stream apply (changelog append + merge into current) of {m['streamed']:.0f} events {m['stream_s']:6.2f} s "
        f"({apply_rate:9.0f} ev/s)   ratio apply/floor = {apply_rate / floor:.3f}"
    )
    print(
        f"  Spark's Kafka source, the same offsets read in the JVM without decoding: {m['jvm_s']:6.2f} s "
        f"({m['jvm_count'] / m['jvm_s']:9.0f} ev/s)   ratio jvm-read/floor = "
        f"{m['jvm_count'] / m['jvm_s'] / floor:.3f}"
    )


if __name__ == "__main__":
    main()
