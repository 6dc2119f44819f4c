"""Many tables of one source: what idle tables cost the busy ones, and the sensor's tick.

A data-platform engineer runs hundreds of tables, most of them idle at any moment. With
``--tables`` tables (default 200) of 10 rows each in the dev stack's shop database, each
with a generation and current built by the platform, one run measures:

* **Kafka watermarks** of every table's topic, three ways: a fresh consumer per topic
  (how the platform asked until 2026-12-05), the kept client per topic, and one question
  for all of them (``KafkaClients.watermarks_of``);
* **an idle stream-apply pass** (``StreamApply.run_pass``: every table, nothing new) over
  all tables against the same over one table (the floor);
* **the rehydration sensor's tick** (``Daemon.evaluate``, every table healthy) with all
  tables against one table (the floor), on an ephemeral instance;
* **a busy table's Kafka → current latency** in continuous mode (``run_forever``), the
  table alone (the floor) and beside all the idle ones: one row updated and captured
  into Kafka, then the time until the apply reports it merged, ``--rounds`` times;
* **a restart with every table behind**: one row of every table updated and captured
  (each table has applied one batch before: its changelog is there, as in a running lake),
  then a new ``cdc-platform apply --once`` process (a deploy or a crash of the long-running
  apply) until every table is current again, against the same process with nothing new
  (the floor: the JVM, the session and every table's state) and with one table behind.

Run: .venv/bin/python bench/bench_many_tables.py [--tables 200 --rounds 10]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import bench_lake
import dagster as dg
from confluent_kafka import TopicPartition

from cdc_platform.config import PlatformConfig
from cdc_platform.config.model import ApplyConfig, ApplyEngine
from cdc_platform.devtools.daemon import Daemon
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.apply import StreamApply, TableApplied
from cdc_platform.lake.session import LONG_RUNNING_DRIVER_MEMORY, get_spark_session
from cdc_platform.lake.tables import LakeTable, lake_table
from cdc_platform.sources import CaptureSettings, open_source

SETTINGS = ApplyConfig(engine=ApplyEngine.STREAM, trigger_interval_s=2.0)


def timed(action: Callable[[], object], repeat: int = 5) -> float:
    """The median of ``repeat`` runs of ``action``, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def fresh_consumer_watermarks(kafka: KafkaClients, topic: str) -> None:
    """One topic's watermarks as the platform asked until 2026-12-05: a consumer per question."""
    consumer = kafka.consumer("offsets")
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        for p in partitions:
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
    finally:
        consumer.close()


def watermark_figures(kafka: KafkaClients, topics: list[str]) -> dict[str, float]:
    return {
        "fresh consumer per topic": timed(lambda: [fresh_consumer_watermarks(kafka, t) for t in topics], 2),
        "kept client per topic": timed(lambda: [kafka.watermarks(t) for t in topics]),
        "one question for all": timed(lambda: kafka.watermarks_of(topics)),
        "one topic (floor)": timed(lambda: kafka.watermarks(topics[0])),
    }


def idle_pass_figures(lake: Lake, tables: list[LakeTable]) -> tuple[float, float]:
    """An idle pass over every table, and over the first alone (the floor)."""
    figures = []
    for chosen in (tables, tables[:1]):
        with StreamApply(lake.spark, lake.ledger, lake.kafka, chosen, SETTINGS) as engine:
            engine.run_pass()  # each table's state read once, as a running apply has it
            figures.append(timed(engine.run_pass))
    return figures[0], figures[1]


def write_config(config: PlatformConfig, path: Path, count: int | None = None) -> Path:
    """The bench's config as a file (the sensor's code location loads one), ``count`` tables."""
    shop = config.sources["shop"]
    tables = config.tables[:count] if count else config.tables
    path.write_text(
        f"""
sources:
  shop:
    host: {shop.host}
    port: {shop.port}
    database: {shop.database}
    user: {shop.user}
    password_env: {shop.password_env}
    slot_name: {shop.slot_name}
    publication: {shop.publication}
    topic_prefix: {shop.topic_prefix}
    apply: {{engine: stream}}
kafka: {{bootstrap_servers: "{config.kafka.bootstrap_servers}", partitions: {config.kafka.partitions}}}
lake: {{root: "{config.lake.root}"}}
spark: {{master: "local[2]", jars_dir: "{config.spark.jars_dir}"}}
tables:
"""
        + "".join(f"  - name: {t.name}\n" for t in tables)
    )
    return path


def sensor_tick_figures(config: PlatformConfig, workdir: Path) -> tuple[float, float]:
    """The rehydration sensor's tick with every table healthy, all tables and one (the floor)."""
    figures = []
    for count in (None, 1):
        path = write_config(config, workdir / f"tables_{count or 'all'}.yaml", count)
        with dg.DagsterInstance.ephemeral() as instance:
            daemon = Daemon(path, instance, log=lambda _m: None)
            result = daemon.evaluate("rehydration")
            assert not result.run_requests, f"a table is not healthy: {result.run_requests}"
            figures.append(timed(lambda d=daemon: d.evaluate("rehydration")))  # type: ignore[misc]
    return figures[0], figures[1]


def busy_latencies(config: PlatformConfig, lake: Lake, tables: list[LakeTable], rounds: int) -> list[float]:
    """Kafka → current of one row's change to the first table, ``tables`` applied continuously."""
    busy = tables[0]
    merged = threading.Event()

    def on_pass(applied: list[TableApplied]) -> None:
        if any(a.table == busy.key and a.batch is not None for a in applied):
            merged.set()

    latencies = []
    stop = threading.Event()
    with StreamApply(lake.spark, lake.ledger, lake.kafka, tables, SETTINGS) as engine:
        runner = threading.Thread(target=engine.run_forever, args=(stop, on_pass), daemon=True)
        runner.start()
        time.sleep(2 * SETTINGS.trigger_interval_s + 1)  # every table's first (idle) pass done
        try:
            for round_no in range(-1, rounds):  # round -1 warms the table's decoding plan up, untimed
                with app_connect(profile("dev")) as app:
                    app.execute(f"UPDATE {busy.config.name.split('.')[-1]} SET amount = amount + 1 WHERE id = 1")
                capture(config)
                merged.clear()
                in_kafka = time.perf_counter()
                if not merged.wait(120):
                    raise RuntimeError(f"round {round_no}: the change was not applied within 120 s")
                if round_no >= 0:
                    latencies.append(time.perf_counter() - in_kafka)
        finally:
            stop.set()
            runner.join()
    return latencies


def restart_figures(
    config: PlatformConfig, workdir: Path, tables: list[LakeTable]
) -> tuple[float, dict[int, tuple[float, int]]]:
    """Wall seconds of a new ``cdc-platform apply --once`` process of one table, nothing
    behind (the JVM and the session); then of every table with 0, 1 and all of them one
    change behind (each case's changes captured before it starts), and its batches."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # nothing reported: the apply alone

    def apply_once(path: Path) -> tuple[float, int]:
        cli = [str(Path(sys.executable).parent / "cdc-platform"), "--config", str(path), "apply", "--source", "shop"]
        started = time.perf_counter()
        done = subprocess.run([*cli, "--once"], env=env, capture_output=True, text=True, timeout=3600, check=False)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"apply --once failed ({done.returncode}): {done.stderr[-3000:]}")
        return elapsed, int(json.loads(done.stdout.strip().splitlines()[-1])["batches"])

    one_table, _ = apply_once(write_config(config, workdir / "restart_one.yaml", 1))
    path = write_config(config, workdir / "restart.yaml")
    figures = {}
    for behind in (0, 1, len(tables)):
        update_one_row(tables[:behind])
        capture(config)
        elapsed, batches = apply_once(path)
        if batches != behind:
            raise RuntimeError(f"{behind} tables behind, but the restart applied {batches} batches")
        figures[behind] = (elapsed, batches)
    return one_table, figures


def capture(config: PlatformConfig) -> None:
    open_source(config, "shop").capture(CaptureSettings(until_caught_up=True, status_interval_s=3600)).run()


def build_tables(config: PlatformConfig, lake: Lake) -> tuple[list[LakeTable], float]:
    """A generation of every table, current built from it and one change applied, as the
    platform does; seconds per table. The change makes each table's changelog: a restart
    of a running lake finds them there (a table's first batch creates it, with Spark)."""
    started = time.perf_counter()
    for table in config.tables:
        lake.snapshot(table.key, "g1")
    tables = [lake_table(config, t) for t in config.tables]
    capture(config)  # its first run makes the slot: a change before it would never reach Kafka
    update_one_row(tables)
    capture(config)
    with StreamApply(lake.spark, lake.ledger, lake.kafka, tables, SETTINGS) as engine:
        engine.run_until_caught_up()
    return tables, (time.perf_counter() - started) / len(tables)


def update_one_row(tables: list[LakeTable]) -> None:
    with app_connect(profile("dev")) as app:
        for table in tables:
            app.execute(f"UPDATE {table.config.name.split('.')[-1]} SET amount = amount + 1 WHERE id = 1")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200, help="tables of one source")
    parser.add_argument("--rounds", type=int, default=10, help="changes of the busy table timed, per case")
    args = parser.parse_args()
    # capture warns once per table of each run about REPLICA IDENTITY DEFAULT, which these tables keep
    logging.getLogger("cdc_platform.capture").setLevel(logging.ERROR)
    tag = uuid.uuid4().hex[:6]
    names = [f"bench_many_{tag}_{i:03d}" for i in range(args.tables)]
    config = bench_lake.with_decoder(bench_lake.prepare(10, tag, tables=names), "jvm")
    # the driver as `cdc-platform apply` starts it (lake/session.long_running_conf's heap)
    conf = {**config.spark.conf, "spark.driver.memory": LONG_RUNNING_DRIVER_MEMORY}
    spark = get_spark_session(config.spark.model_copy(update={"master": "local[2]", "conf": conf}))
    try:
        lake = Lake(config, spark)
        tables, setup_s = build_tables(config, lake)
        print(f"{args.tables} tables: a generation, current and one change applied each, {setup_s:.2f} s per table")
        marks = watermark_figures(lake.kafka, [t.topic for t in tables])
        idle_all, idle_one = idle_pass_figures(lake, tables)
        tick_all, tick_one = sensor_tick_figures(config, Path(tempfile.mkdtemp(prefix="bench_many_")))
        alone = busy_latencies(config, lake, tables[:1], args.rounds)
        among = busy_latencies(config, lake, tables, args.rounds)
        one_table, restarts = restart_figures(config, Path(tempfile.mkdtemp(prefix="bench_many_")), tables)
    finally:
        bench_lake.cleanup(config, tag, names)
    floor = marks["one topic (floor)"]
    print(f"\nKafka watermarks of {args.tables} topics (median; floor: one topic with the kept client)")
    for name, seconds in marks.items():
        print(f"  {name:26} {seconds * 1000:9.1f} ms   {seconds / floor:7.1f}x floor")
    print(f"idle stream-apply pass: {args.tables} tables {idle_all * 1000:.1f} ms, 1 table {idle_one * 1000:.1f} ms "
          f"(floor), {idle_all / idle_one:.1f}x, {idle_all / args.tables * 1000:.2f} ms per table")  # fmt: skip
    print(f"rehydration sensor tick: {args.tables} tables {tick_all:.2f} s, 1 table {tick_one:.2f} s (floor), "
          f"{tick_all / tick_one:.1f}x")  # fmt: skip
    for label, values in (("alone (floor)", alone), (f"among {args.tables - 1} idle", among)):
        print(f"busy table Kafka -> current, {label:16}: p50 {statistics.median(values):.2f} s, "
              f"p95 {percentile(values, 0.95):.2f} s, max {max(values):.2f} s")  # fmt: skip
    print(f"  p50 ratio among idle / alone: {statistics.median(among) / statistics.median(alone):.2f}")
    floor_s = restarts[0][0]
    print("restart (a new `cdc-platform apply --once`) until every table is current; floor: nothing behind")
    idle = (floor_s - one_table) / max(1, args.tables - 1)
    print(f"  one table configured, nothing behind: {one_table:.2f} s; so {idle:.2f} s per idle table")
    for behind, (seconds, batches) in restarts.items():
        extra = f", {(seconds - floor_s) / behind:.2f} s per table behind" if behind else ""
        ratio = seconds / floor_s
        print(f"  {behind:4d} tables behind: {seconds:7.2f} s, {batches} batches, {ratio:5.2f}x floor{extra}")


if __name__ == "__main__":
    main()
