"""Snapshot and changelog throughput against their floors, measured in the same run.

* snapshot: rows/s of a generation into Delta (consistent parallel Spark JDBC read) vs
  ``COPY (SELECT …) TO STDOUT`` of the same table read to nowhere (the floor);
* changelog: events/s of one window decoded into Delta vs a plain confluent-kafka
  consume of the same offsets (the floor), and the same offsets read (not decoded) by
  Spark's own Kafka source in the JVM.

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
from datetime import UTC, datetime, timedelta

import psycopg
from confluent_kafka import TopicPartition

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.config.model import TableConfig
from cdc_platform.devtools.demo.setup import setup_demo
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile, stack_up
from cdc_platform.devtools.stack.postgres import LocalPostgres
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.devtools.stack.stack import load_stack_env
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.session import get_spark_session
from cdc_platform.model.windows import WindowRange
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.postgres.slot import drop_slot

TABLE = "bench_lake_rows"


def prepare(rows: int, tag: str, changelog: dict[str, object] | None = None) -> PlatformConfig:
    """A ``rows``-row table ``TABLE`` in the dev stack with its own publication, slot and
    topic prefix (``tag``), and a config holding just that table."""
    prof = profile("dev")
    stack_up(prof)
    load_stack_env(prof)
    list(setup_demo(prof))
    with app_connect(prof) as app:
        app.execute(f"DROP TABLE IF EXISTS {TABLE}")
        app.execute(
            f"""CREATE TABLE {TABLE} (id bigint PRIMARY KEY, amount numeric(12,2), label text,
                                     at timestamptz, doc jsonb)"""
        )
        app.execute(
            f"""INSERT INTO {TABLE} SELECT g, (g %% 100000) / 100.0, md5(g::text), now() - g * interval '1 s',
                       jsonb_build_object('g', g, 'tag', 'x') FROM generate_series(1, %s) g""",
            (rows,),
        )
        app.execute(f"CREATE PUBLICATION bench_{tag} FOR TABLE {TABLE}")
        app.commit()
    base = load_config(REPO_ROOT / "cdc_platform.yaml")
    shop = base.sources["shop"].model_copy(
        update={"slot_name": f"bench_{tag}", "publication": f"bench_{tag}", "topic_prefix": f"bench{tag}"}
    )
    lake = base.lake.model_copy(update={"root": tempfile.mkdtemp(prefix="bench_lake_")})
    table = TableConfig(name=f"shop.public.{TABLE}", changelog=changelog or {"grace_s": 0})  # type: ignore[arg-type]
    return base.model_copy(update={"sources": {"shop": shop}, "tables": [table], "lake": lake})


def cleanup(config: PlatformConfig, tag: str) -> None:
    """Remove what ``prepare`` made: the slot (a forgotten one pins WAL), publication,
    table and topics. Ends a capture still holding the slot first."""
    with LocalPostgres(profile("dev")).admin_connect("shop") as admin:
        drop_slot(admin, f"bench_{tag}", terminate_user=True)
        time.sleep(1.0)  # the terminated backend lets go of the slot
        drop_slot(admin, f"bench_{tag}")
        admin.execute(f"DROP PUBLICATION IF EXISTS bench_{tag}")
        admin.execute(f"DROP TABLE IF EXISTS {TABLE}")
    admin_client = KafkaClients(config.kafka).admin()
    doomed = [t for t in admin_client.list_topics(timeout=10).topics if f"bench{tag}" in t]
    for future in admin_client.delete_topics(doomed).values() if doomed else []:
        future.result(timeout=30)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = prepare(args.rows, tag)
    table = config.tables[0]
    lake = Lake(config, get_spark_session(config.spark.model_copy(update={"master": "local[*]"})))
    settings = CaptureSettings(until_caught_up=True, status_interval_s=3600)
    try:
        lake.snapshot(table.key, "warmup")  # JVM, JDBC and Delta paths warm
        copy_bytes, copy_s = copy_floor(config)
        started = time.perf_counter()
        result = lake.snapshot(table.key, "g1")
        snapshot_s = time.perf_counter() - started

        open_source(config, "shop").capture(settings).run()  # slot and topic exist before the changes
        t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        with app_connect(profile("dev")) as app:
            app.execute(f"UPDATE {TABLE} SET amount = amount + 1 WHERE id <= %s", (args.changes,))
        open_source(config, "shop").capture(settings).run()
        time.sleep(1.1)
        t1 = datetime.now(UTC).replace(microsecond=0)
        started = time.perf_counter()
        window = lake.window(table.key, t0, t1)
        cold_s = time.perf_counter() - started  # first Python workers, first Delta commit
        started = time.perf_counter()
        window = lake.window(table.key, t0, t1)  # the same window again (idempotent)
        changelog_s = time.perf_counter() - started
        consumed, consume_s = consume_floor(config, table, window.ranges)
        jvm_read(lake.spark, config, table, window.ranges)  # warm: the Kafka source's first classes and consumers
        jvm_count, jvm_s = jvm_read(lake.spark, config, table, window.ranges)
    finally:
        cleanup(config, tag)

    print(f"\nsnapshot of {result.rows} rows (same run; floor = COPY TO STDOUT of the same table)")
    print(
        f"  COPY {copy_s:6.2f} s ({result.rows / copy_s:9.0f} rows/s, {copy_bytes / 1e6:.0f} MB)   "
        f"snapshot into Delta {snapshot_s:6.2f} s ({result.rows / snapshot_s:9.0f} rows/s, "
        f"{result.spark_partitions} partitions)   ratio snapshot/floor = {copy_s / snapshot_s:.3f}"
    )
    print(f"changelog window of {window.rows} events (floor = plain confluent-kafka consume of the same offsets)")
    print(
        f"  consume {consume_s:6.2f} s ({consumed / consume_s:9.0f} ev/s)   window into Delta {changelog_s:6.2f} s "
        f"({window.rows / changelog_s:9.0f} ev/s)   ratio changelog/floor = {consume_s / changelog_s:.3f}"
    )
    print(f"  (first run of the window, cold Python workers and table creation: {cold_s:.2f} s)")
    print(
        f"  Spark's Kafka source, the same offsets read in the JVM without decoding: {jvm_s:6.2f} s "
        f"({jvm_count / jvm_s:9.0f} ev/s)   ratio jvm-read/floor = {consume_s / jvm_s:.3f}"
    )


if __name__ == "__main__":
    main()
