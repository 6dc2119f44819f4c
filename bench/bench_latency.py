"""Latency: commit in PostgreSQL -> visible in current, p50/p95, per apply engine.

A steady writer commits single-row updates; capture streams them (a thread, as the
long-running process would). With ``--engine windows`` a driver does what the daemon's
sensors do — materialize each window once it is closed (end + grace) and apply it to
current; with ``--engine stream`` the stream apply (``lake/apply.py``, what
``cdc-platform apply`` runs) applies micro-batches continuously. Each committed version's
arrival in current is recorded. The baseline, measured in the same run, is commit ->
record in Kafka (what capture alone adds).

With ``--demo`` (stream only), every demo table of the shop source is applied by the same
apply, in the same passes, while the demo workload (``demo load``, 5 transactions/s)
changes them: the issue's setting, "every demo table at once". The timed writer then
updates a probe table that the apply applies alongside them.

Its report also gives the commits after the run's first 60 s apart (a long-running
apply's steady state: JIT warm, caches built), and p95 by 20-second period of commit
time, which shows where the slow commits fall (the start: each table's first batch).

Run: .venv/bin/python bench/bench_latency.py --engine stream --demo --minutes 3
     .venv/bin/python bench/bench_latency.py --engine stream --minutes 3
     .venv/bin/python bench/bench_latency.py --window 1m --grace 5 --minutes 3
     .venv/bin/python bench/bench_latency.py --window 5m --grace 20 --minutes 11   (the demo's setting)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import bench_demo_lag
import bench_lake
from confluent_kafka import TopicPartition

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.config.model import ApplyConfig, ApplyEngine, SparkConfig
from cdc_platform.devtools.demo.workload import app_connect, run_workload
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.apply import StreamApply, TableApplied
from cdc_platform.lake.delta_rs import open_table, read_columns
from cdc_platform.lake.session import DRIVER_JAVA_OPTIONS, LONG_RUNNING_DRIVER_MEMORY, get_spark_session
from cdc_platform.model.windows import is_closed, window_seconds, window_start
from cdc_platform.sources import CaptureSettings, open_source

bench_lake.TABLE = "bench_latency_rows"
ROWS = 1000
SETTLE_S = 60.0  # the steady-state line leaves out commits this early in the run


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LatencyRun:
    """One measurement: a writer, a Kafka reader, and the windows applied as they close."""

    def __init__(self, args: argparse.Namespace, tag: str) -> None:
        self.args, self.tag = args, tag
        self.config = bench_lake.prepare(ROWS, tag, changelog={"window": args.window, "grace_s": args.grace})
        self.table = self.config.tables[0]
        if args.demo:
            self.config = with_demo_tables(self.config, tag)
        self.lake = Lake(self.config, get_spark_session(bench_spark(self.config, args)))
        self.committed: dict[tuple[int, int], float] = {}  # (id, version) -> commit time
        self.in_kafka: dict[tuple[int, int], float] = {}
        self.visible: dict[tuple[int, int], float] = {}
        self.stop_writing = threading.Event()
        self.stop_all = threading.Event()
        self.batches: list[tuple[str, float]] = []  # (table, seconds) of every micro-batch
        # the probe's batches as the apply's log line gives them: what bench_demo_lag estimates from
        self.logged: list[bench_demo_lag.Batch] = []

    def writer(self) -> None:
        version = 0
        with app_connect(profile("dev")) as app:
            while not self.stop_writing.is_set():
                version += 1
                row = version % ROWS + 1
                app.execute(f"UPDATE {bench_lake.TABLE} SET label = %s WHERE id = %s", (str(version), row))
                app.commit()
                self.committed[(row, version)] = time.time()
                time.sleep(1 / self.args.rate)

    def kafka_reader(self) -> None:
        consumer = KafkaClients(self.config.kafka).consumer(f"lat{self.tag}")
        topic = self.config.topic_for(self.table)
        while topic not in consumer.list_topics(timeout=10).topics:
            time.sleep(0.5)
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p))[1])
                         for p in partitions])  # fmt: skip
        while not self.stop_all.is_set():
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() or msg.value() is None:
                    continue
                after = json.loads(msg.value() or b"{}").get("after") or {}
                if "label" in after:
                    self.in_kafka.setdefault((int(after["id"]), int(after["label"])), time.time())
        consumer.close()

    def apply_until_seen(self) -> None:
        """What the changelog sensor + current automation do: closed windows, then apply."""
        size = window_seconds(self.table.changelog.window)
        next_window = window_start(datetime.now(UTC), size)
        writing_until = time.time() + self.args.minutes * 60
        while True:
            if time.time() > writing_until:
                self.stop_writing.set()
            applied = False
            while is_closed(next_window + timedelta(seconds=size), datetime.now(UTC), self.args.grace, False):
                self.lake.window(self.table.key, next_window, next_window + timedelta(seconds=size))
                next_window += timedelta(seconds=size)
                applied = True
            if applied:
                self.lake.current(self.table.key)
                self.record_visible(time.time())
            done = self.committed and len(self.visible) == len(self.committed)
            if self.stop_writing.is_set() and (done or time.time() > writing_until + 600):
                return
            time.sleep(1.0)

    def apply_streaming(self) -> None:
        """What ``cdc-platform apply`` does: ``run_forever``, each table on its own cadence."""
        settings = ApplyConfig(
            engine=ApplyEngine.STREAM, trigger_interval_s=self.args.trigger, parallelism=self.args.parallelism,
            min_batch_interval_s=self.args.min_batch_interval,
        )  # fmt: skip
        tables = [self.lake.table(t.key) for t in self.config.tables]
        writing_until = time.time() + self.args.minutes * 60
        stop = threading.Event()

        def on_pass(applied: list[TableApplied]) -> None:
            if time.time() > writing_until:
                self.stop_writing.set()
            if any(a.table == self.table.key and a.batch for a in applied):
                self.record_visible(time.time())
                self.logged += [logged_batch(a) for a in applied if a.table == self.table.key and a.batch]
            self.batches.extend((a.table, a.duration_s) for a in applied if a.batch)
            done = self.committed and len(self.visible) == len(self.committed)
            if self.stop_writing.is_set() and (done or time.time() > writing_until + 600):
                stop.set()

        with StreamApply(self.lake.spark, self.lake.ledger, self.lake.kafka, tables, settings) as engine:
            engine.run_forever(stop, on_pass)

    def gc_seconds(self) -> float:
        """The driver JVM's collectors' time so far (every collector's MXBean)."""
        jvm = self.lake.spark.sparkContext._jvm
        assert jvm is not None
        beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
        return sum(bean.getCollectionTime() for bean in beans) / 1000.0

    def record_visible(self, seen: float) -> None:
        """The versions current now shows. Read with delta-rs, as a reader outside the apply
        would: a Spark read here ran in the apply's driver, inside ``on_pass``, holding the
        apply's next batches back while it ran (0.1-0.3 s a probe batch)."""
        current = open_table(self.lake.table(self.table.key).current_path)
        rows = read_columns(current, ["id", "label"]).to_pylist() if current is not None else []
        labels = {int(r["id"]): int(r["label"]) for r in rows if r["label"] and r["label"].isdigit()}
        for row, version in list(self.committed):
            if (row, version) not in self.visible and labels.get(row, -1) >= version:
                self.visible[(row, version)] = seen

    def settled_latencies(self) -> list[float]:
        """Commit -> current of the commits made after the run's first ``SETTLE_S``: a
        long-running apply's steady state, without its start (cold JIT, first batches)."""
        if not self.committed:
            return []
        first = min(self.committed.values())
        return [self.visible[k] - self.committed[k] for k in self.visible if self.committed[k] - first >= SETTLE_S]

    def report_by_period(self, period_s: float = 20.0) -> None:
        """p95 of commit -> current by when the commit was made: where a run's slow commits
        fall (a cold start, a compaction, a table's first batch)."""
        if not self.visible:
            return
        first = min(self.committed.values())
        periods: dict[int, list[float]] = {}
        for k, seen in self.visible.items():
            periods.setdefault(int((self.committed[k] - first) // period_s), []).append(seen - self.committed[k])
        shown = ", ".join(f"{int(i * period_s)}s {percentile(v, 0.95):.1f}" for i, v in sorted(periods.items()))
        print(f"  p95 by commit time ({period_s:.0f} s periods): {shown}")

    def report(self) -> None:
        lake = [self.visible[k] - self.committed[k] for k in self.visible]
        kafka = [self.in_kafka[k] - self.committed[k] for k in self.committed if k in self.in_kafka]
        args = self.args
        counts = f"{len(self.committed)} commits, {len(self.visible)} seen in current, {len(kafka)} seen in Kafka"
        how = "stream apply" if args.engine == "stream" else f"window {args.window}, grace {args.grace:.0f} s"
        print(f"\nlatency, commit -> visible in current ({how}; {counts})")
        print(
            f"  baseline commit -> Kafka   p50 {percentile(kafka, 0.5):7.2f} s   p95 {percentile(kafka, 0.95):7.2f} s"
        )
        p50, p95 = percentile(lake, 0.5), percentile(lake, 0.95)
        print(f"  commit -> current          p50 {p50:7.2f} s   p95 {p95:7.2f} s   "
              f"max {max(lake):7.2f} s   mean {statistics.mean(lake):7.2f} s")  # fmt: skip
        print(f"  ratio current/Kafka p50 = {percentile(lake, 0.5) / max(percentile(kafka, 0.5), 1e-3):.0f}x")
        settled = self.settled_latencies()
        if settled:
            p50, p95 = percentile(settled, 0.5), percentile(settled, 0.95)
            print(f"  after the first {SETTLE_S:.0f} s          p50 {p50:7.2f} s   p95 {p95:7.2f} s   "
                  f"({len(settled)} commits; warm JVM and caches)")  # fmt: skip
        self.report_by_period()
        if self.logged:  # is the demo's log-based figure (bench_demo_lag) the truth above?
            waits = [w for b in self.logged for w in b.waits()]
            p50, p95 = (bench_demo_lag.weighted_percentile(waits, q) for q in (0.5, 0.95))
            print(f"  estimated from the log     p50 {p50:7.2f} s   p95 {p95:7.2f} s   "
                  f"(bench_demo_lag's estimate from the probe's {len(self.logged)} batch lines)")  # fmt: skip
        print(f"  driver JVM: {self.gc_seconds():.1f} s in garbage collection over the run, "
              f"{driver_cpu_seconds():.0f} CPU-s in all")  # fmt: skip
        if self.batches:
            seconds = [d for _, d in self.batches]
            probe = [d for t, d in self.batches if t == self.table.key]
            print(f"  micro-batches: {len(self.batches)} over {len(self.config.tables)} tables (one apply), "
                  f"each p50 {percentile(seconds, 0.5):.2f} s, p95 {percentile(seconds, 0.95):.2f} s; "
                  f"probe table's p50 {percentile(probe or [float('nan')], 0.5):.2f} s")  # fmt: skip


def driver_cpu_seconds() -> float:
    """CPU seconds of this process's Spark driver JVM (its child ``java``), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name == "java" and int(fields[1]) == os.getpid():
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def bench_spark(config: PlatformConfig, args: argparse.Namespace) -> SparkConfig:
    """The driver as the process the bench stands in for starts it: the stream engine's is
    ``cdc-platform apply``'s, with the long-running heap (``lake/session.long_running_conf``);
    ``--driver-memory`` replaces that heap, ``--java-options`` go after the platform's own driver options."""
    conf = dict(config.spark.conf)
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    elif args.engine == "stream":
        conf.setdefault("spark.driver.memory", LONG_RUNNING_DRIVER_MEMORY)
    if args.java_options:
        conf[DRIVER_JAVA_OPTIONS] = " ".join(o for o in (conf.get(DRIVER_JAVA_OPTIONS), args.java_options) if o)
    return config.spark.model_copy(update={"master": "local[*]", "conf": conf})


def logged_batch(applied: TableApplied) -> bench_demo_lag.Batch:
    """The figures the apply's log line gives for a batch (``describe``), read now as it does."""
    now = datetime.now(UTC)
    newest = applied.current.last_source_ts if applied.current else None
    behind = (now - newest).total_seconds() if newest else 0.0
    waited = applied.oldest_wait_s(now)
    changes = applied.current.changes_applied if applied.current else 0
    return bench_demo_lag.Batch(now, applied.table, changes, behind, behind if waited is None else waited)


def with_demo_tables(config: PlatformConfig, tag: str) -> PlatformConfig:
    """The bench config plus every demo table of the shop source, in the bench's own
    publication (so its slot and topics carry them too)."""
    base = load_config(REPO_ROOT / "cdc_platform.yaml")
    demo = [t for t in base.tables if t.source == "shop"]
    with app_connect(profile("dev")) as app:  # shop_app owns the demo tables
        names = ", ".join(t.name.split(".", 1)[1] for t in demo)
        app.execute(f"ALTER PUBLICATION bench_{tag} ADD TABLE {names}")
        app.commit()
    return config.model_copy(update={"tables": [*config.tables, *demo]})


def demo_workload(run: LatencyRun) -> None:
    """The demo's own workload (``cdc-platform demo load``) while the timed writer writes."""
    seconds = run.args.minutes * 60
    run_workload(profile("dev"), rate=run.args.demo_rate, seconds=seconds, seed=int(time.time()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["windows", "stream"], default="windows")
    parser.add_argument("--trigger", type=float, default=0.5, help="stream: pause when the topic is idle (s)")
    parser.add_argument("--window", default="1m")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the writer commits")
    parser.add_argument("--rate", type=float, default=2.0, help="commits per second")
    parser.add_argument("--demo", action="store_true", help="stream: every demo table at once, under the demo load")
    parser.add_argument("--demo-rate", type=float, default=5.0, help="--demo: the demo workload's transactions/s")
    parser.add_argument("--parallelism", type=int, default=None, help="stream: tables applied at once")
    parser.add_argument("--min-batch-interval", type=float, default=0.0, help="stream: apply.min_batch_interval_s (s)")
    parser.add_argument("--driver-memory", default=None, help="the driver's heap (default: the apply's)")
    parser.add_argument("--java-options", default="", help="extra driver JVM options (e.g. collector sizing)")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    run = LatencyRun(args, tag)
    capture = open_source(run.config, "shop").capture(CaptureSettings(status_interval_s=1))
    try:
        open_source(run.config, "shop").capture(CaptureSettings(until_caught_up=True)).run()  # slot and topic
        for table in run.config.tables:
            run.lake.snapshot(table.key, "g1")
            run.lake.current(table.key)
        workers = [capture.run, run.writer, run.kafka_reader] + ([lambda: demo_workload(run)] if args.demo else [])
        for target in workers:
            threading.Thread(target=target, daemon=True).start()
        run.apply_streaming() if args.engine == "stream" else run.apply_until_seen()
        run.stop_writing.set()
        run.stop_all.set()
        capture.stop()
        run.report()  # before the cleanup: its figures are what the run was for
    finally:
        run.stop_writing.set()
        run.stop_all.set()
        capture.stop()
        bench_lake.cleanup(run.config, tag)


if __name__ == "__main__":
    main()
