"""Latency: commit in PostgreSQL -> visible in current, p50/p95, per changelog configuration.

A steady writer commits single-row updates; capture streams them (a thread, as the
long-running process would); a driver does what the daemon's sensors do — materialize
each window once it is closed (end + grace) and apply it to current — and records when
each committed version becomes visible in current. The baseline, measured in the same
run, is commit -> record in Kafka (what capture alone adds).

Run: .venv/bin/python bench/bench_latency.py --window 1m --grace 5 --minutes 3
     .venv/bin/python bench/bench_latency.py --window 5m --grace 20 --minutes 11   (the demo's setting)
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime

import bench_lake
from confluent_kafka import Consumer, TopicPartition

from cdc_platform.capture.postgres import CaptureOptions, PostgresCapture
from cdc_platform.config.model import SparkConfig
from cdc_platform.demo.workload import app_connect
from cdc_platform.devstack import profile
from cdc_platform.factories.table import changelog_partitions
from cdc_platform.spark.changelog import materialize_window
from cdc_platform.spark.current import apply_changes, current_path
from cdc_platform.spark.session import get_spark_session
from cdc_platform.spark.snapshot import take_snapshot

bench_lake.TABLE = "bench_latency_rows"
ROWS = 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", default="1m")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the writer commits")
    parser.add_argument("--rate", type=float, default=2.0, help="commits per second")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = bench_lake.prepare(ROWS, tag, changelog={"window": args.window, "grace_s": args.grace})
    table = config.tables[0]
    spark = get_spark_session(SparkConfig(master="local[*]"))
    committed: dict[tuple[int, int], float] = {}  # (id, version) -> commit time
    in_kafka: dict[tuple[int, int], float] = {}
    visible: dict[tuple[int, int], float] = {}
    stop_writing = threading.Event()
    stop_all = threading.Event()
    capture = PostgresCapture(config, "shop", CaptureOptions(status_interval_s=1))
    try:
        PostgresCapture(config, "shop", CaptureOptions(until_caught_up=True)).run()  # slot and topic
        take_snapshot(spark, config, table, "g1")
        apply_changes(spark, config, table)
        capture_thread = threading.Thread(target=capture.run, daemon=True)
        capture_thread.start()

        def writer() -> None:
            version = 0
            with app_connect(profile("dev")) as app:
                while not stop_writing.is_set():
                    version += 1
                    row = version % ROWS + 1
                    app.execute(f"UPDATE {bench_lake.TABLE} SET label = %s WHERE id = %s", (str(version), row))
                    app.commit()
                    committed[(row, version)] = time.time()
                    time.sleep(1 / args.rate)

        def kafka_reader() -> None:
            consumer = Consumer({**config.kafka.client_config(), "group.id": f"lat{tag}", "enable.auto.commit": False})
            topic = config.topic_for(table)
            while topic not in consumer.list_topics(timeout=10).topics:
                time.sleep(0.5)
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p))[1])
                             for p in partitions])  # fmt: skip
            while not stop_all.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() or msg.value() is None:
                        continue
                    after = json.loads(msg.value() or b"{}").get("after") or {}
                    if "label" in after:
                        in_kafka.setdefault((int(after["id"]), int(after["label"])), time.time())
            consumer.close()

        threads = [threading.Thread(target=writer, daemon=True), threading.Thread(target=kafka_reader, daemon=True)]
        for t in threads:
            t.start()
        partitions_def = changelog_partitions(table)
        started = datetime.now(UTC)
        done_windows: set[str] = set()
        writing_until = time.time() + args.minutes * 60
        while True:
            now = datetime.now(UTC)
            if time.time() > writing_until:
                stop_writing.set()
            # what the changelog sensor + current automation do: closed windows, then apply
            due = []
            key = partitions_def.get_partition_key_for_timestamp(started.timestamp())
            while key is not None:
                window = partitions_def.time_window_for_partition_key(key)
                if now.timestamp() < window.end.timestamp() + args.grace:
                    break
                if key not in done_windows:
                    due.append(key)
                key = partitions_def.get_next_partition_key(key)
            for key in due:
                window = partitions_def.time_window_for_partition_key(key)
                materialize_window(spark, config, table, window.start, window.end)
                done_windows.add(key)
            if due:
                apply_changes(spark, config, table)
                seen = time.time()
                rows = spark.read.format("delta").load(current_path(config, table)).select("id", "label").collect()
                labels = {int(r["id"]): int(r["label"]) for r in rows if r["label"] and r["label"].isdigit()}
                for (row, version), _ in list(committed.items()):
                    if (row, version) not in visible and labels.get(row, -1) >= version:
                        visible[(row, version)] = seen
            if stop_writing.is_set() and committed and len(visible) == len(committed):
                break
            if stop_writing.is_set() and time.time() > writing_until + 600:
                break
            time.sleep(1.0)
    finally:
        stop_writing.set()
        stop_all.set()
        capture.stop()
        bench_lake.cleanup(config, tag)

    lake = [visible[k] - committed[k] for k in visible]
    kafka = [in_kafka[k] - committed[k] for k in committed if k in in_kafka]
    print(f"\nlatency, commit -> visible in current (window {args.window}, grace {args.grace:.0f} s; "
          f"{len(committed)} commits, {len(visible)} seen in current, {len(kafka)} seen in Kafka)")  # fmt: skip
    print(f"  baseline commit -> Kafka   p50 {percentile(kafka, 0.5):7.2f} s   p95 {percentile(kafka, 0.95):7.2f} s")
    print(f"  commit -> current          p50 {percentile(lake, 0.5):7.2f} s   p95 {percentile(lake, 0.95):7.2f} s   "
          f"max {max(lake):7.2f} s   mean {statistics.mean(lake):7.2f} s")  # fmt: skip
    print(f"  ratio current/Kafka p50 = {percentile(lake, 0.5) / max(percentile(kafka, 0.5), 1e-3):.0f}x")


if __name__ == "__main__":
    main()
