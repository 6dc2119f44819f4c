"""Fault injection: break things under a steady workload, then prove the lake is still
exactly the source (``cdc-platform faults``; a trimmed run is part of the test suite).

Everything runs against a local stack profile on loopback, with its own publication,
slot and topic prefix, and a lake under a work directory. Capture runs as a separate
process (so it can be SIGKILLed); the shop workload runs in a thread that reconnects
after a PostgreSQL restart, and pgbench adds write load on the same server. A driver
does what the sensors do: materialize changelog ranges and apply them to current.

After each fault the workload pauses, the pipeline settles, and:
* ``cdc-platform verify``'s comparison passes for every table (nothing lost, no
  duplicate or ghost rows);
* dead letters hold exactly the bad records injected so far;
* the accounting balances: per table, the offsets covered by recorded changelog ranges
  equal the changelog's rows plus its dead letters.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from cdc_platform.config import PlatformConfig, TableConfig, load_config
from cdc_platform.demo.setup import setup_demo
from cdc_platform.demo.workload import ShopWorkload, app_connect
from cdc_platform.devstack import StackProfile, stack_up
from cdc_platform.devstack.kafka import LocalKafka
from cdc_platform.devstack.postgres import LocalPostgres, pgbench_path
from cdc_platform.devstack.stack import load_stack_env, stack_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TABLES = ("customers", "orders", "order_lines", "payments")
FAULTS = ("capture_kill", "broker_restart", "postgres_restart", "spark_kill", "bad_records", "retention")
OVERSIZED_BYTES = 900_000  # under the broker's 1 MB limit: it lands, and must be dead-lettered


@dataclass
class FaultResult:
    fault: str
    injected: int
    recovered: bool
    rows_compared: int
    mismatches: int  # missing + extra + differing rows over all tables
    dead_letters: int
    expected_dead_letters: int
    accounting_ok: bool
    seconds: float
    note: str = ""


class Workload(threading.Thread):
    """The shop workload at ``rate`` tx/s until stopped; survives a PostgreSQL restart."""

    def __init__(self, profile: StackProfile, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.profile, self.rate, self.rng = profile, rate, random.Random(seed)  # noqa: S311 - fault timing, not crypto
        self.running = threading.Event()
        self.stopped = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            if not self.running.wait(0.2):
                continue
            try:
                with app_connect(self.profile) as conn:
                    conn.autocommit = True
                    shop = ShopWorkload(conn, self.rng)
                    while self.running.is_set() and not self.stopped.is_set():
                        shop.step()
                        self.transactions += 1
                        time.sleep(1.0 / self.rate)
            except psycopg.Error:
                time.sleep(1.0)  # the server restarts: reconnect


class FaultSuite:
    def __init__(
        self,
        profile: StackProfile,
        workdir: Path,
        spark: SparkSession,
        rate: float = 20.0,
        seed: int = 1,
        log: Callable[[str], None] = print,
        pgbench: bool = True,
        tables: tuple[str, ...] = TABLES,
    ) -> None:
        self.profile, self.workdir, self.spark, self.rate, self.log = profile, workdir, spark, rate, log
        self.rng = random.Random(seed)  # noqa: S311 - fault timing, not crypto
        self.tag = uuid.uuid4().hex[:6]
        self.pgbench = pgbench
        self.table_names = tables  # the first gets the retention fault, the second bad records and kills
        self.workload = Workload(profile, rate, seed)
        self.capture: subprocess.Popen[bytes] | None = None
        self.bench: subprocess.Popen[bytes] | None = None
        self.window_start = datetime.now(UTC).replace(microsecond=0)
        self.expected_dead = 0
        self.killed_window: tuple[datetime, datetime] | None = None
        self.config_path = workdir / "faults.yaml"

    # ------------------------------------------------------------ setup / teardown

    def setup(self) -> PlatformConfig:
        from cdc_platform.spark.current import apply_changes
        from cdc_platform.spark.snapshot import take_snapshot

        stack_up(self.profile)
        load_stack_env(self.profile)
        list(setup_demo(self.profile))
        with app_connect(self.profile) as app:
            app.execute(f"CREATE PUBLICATION faults_{self.tag} FOR TABLE {', '.join(self.table_names)}")
            app.commit()
        entry = "  - name: shop.public.{}\n    errors: {{tolerance: all, dead_letter_threshold: 1000}}\n"
        # windows close as soon as the driver asks (it settles capture first): no grace
        tables = "".join(entry.format(t) + "    changelog: {grace_s: 0}\n" for t in self.table_names)
        self.config_path.write_text(
            f"""sources:
  shop:
    port: {self.profile.pg_port}
    database: shop
    user: cdc_capture
    password_env: CDC_PG_PASSWORD
    slot_name: faults_{self.tag}
    publication: faults_{self.tag}
    topic_prefix: faults{self.tag}
    heartbeat_interval_s: 1
kafka:
  bootstrap_servers: {self.profile.kafka_bootstrap}
  partitions: 3
  cleanup_policy: compact,delete
lake:
  root: lake
tables:
{tables}"""
        )
        config = self.config
        self.start_capture()
        self.wait_caught_up()
        self.workload.start()
        self.workload.running.set()
        if self.pgbench:
            self.bench = subprocess.Popen(
                [
                    pgbench_path(),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.profile.pg_port),
                    "-U",
                    "shop_app",
                    "-c",
                    "2",
                    "-R",
                    "50",
                    "-T",
                    "3600",
                    "-n",
                    "bench",
                ],
                env={**os.environ, "PGPASSWORD": os.environ["SHOP_APP_PASSWORD"]},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(2)
        for table in self.tables:  # the generation is taken while the workload runs
            take_snapshot(self.spark, config, table, "g1", log_progress=lambda _m: None)
            apply_changes(self.spark, config, table)
        return config

    def teardown(self) -> None:
        self.workload.stopped.set()
        for proc in (self.capture, self.bench):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        with LocalPostgres(self.profile).admin_connect("shop") as admin:
            admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (f"faults_{self.tag}",),
            )
            time.sleep(1)
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (f"faults_{self.tag}",),
            )
            admin.execute(f"DROP PUBLICATION IF EXISTS faults_{self.tag}")

    @property
    def config(self) -> PlatformConfig:
        return load_config(self.config_path)

    @property
    def tables(self) -> list[TableConfig]:
        return list(self.config.tables)

    # ------------------------------------------------------------ processes

    def start_capture(self) -> None:
        log = (self.workdir / "capture.log").open("ab")
        self.capture = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cdc_platform.cli",
                "capture",
                "run",
                "--source",
                "shop",
                "--config",
                str(self.config_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **stack_env(self.profile)},
        )

    def ensure_capture(self) -> None:
        if self.capture is None or self.capture.poll() is not None:
            self.start_capture()

    def wait_caught_up(self, timeout_s: float = 120.0) -> None:
        """Capture confirmed everything committed so far (restarting it if it died)."""
        deadline = time.monotonic() + timeout_s
        with LocalPostgres(self.profile).admin_connect("shop") as admin:
            row = admin.execute("SELECT pg_current_wal_lsn()").fetchone()
            assert row is not None
            target = row[0]
            while time.monotonic() < deadline:
                self.ensure_capture()
                done = admin.execute(
                    "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                    (target, f"faults_{self.tag}"),
                ).fetchone()
                if done and done[0]:
                    return
                time.sleep(0.5)
        raise TimeoutError(
            f"capture did not confirm {target} within {timeout_s:.0f} s (see {self.workdir}/capture.log)"
        )

    # ------------------------------------------------------------ the faults

    def capture_kill(self, times: int = 3) -> int:
        for _ in range(times):
            time.sleep(self.rng.uniform(0.5, 3.0))
            assert self.capture is not None
            self.capture.send_signal(signal.SIGKILL)
            self.capture.wait(timeout=30)
            self.start_capture()
        return times

    def broker_restart(self) -> int:
        kafka = LocalKafka(self.profile)
        kafka.down()
        time.sleep(3)
        kafka.up()
        return 1

    def postgres_restart(self) -> int:
        postgres = LocalPostgres(self.profile)
        postgres.down()
        time.sleep(2)
        postgres.up(stack_env(self.profile))
        return 1

    def spark_kill(self) -> int:
        """A changelog window written by another process, killed while it writes; the
        driver then materializes the same window again (idempotent)."""
        self.workload.running.clear()
        self.wait_caught_up()
        time.sleep(1.1)
        end = datetime.now(UTC).replace(microsecond=0)
        self.workload.running.set()
        table = self.tables[1]
        script = (
            "import sys; from datetime import datetime; from cdc_platform.config import load_config; "
            "from cdc_platform.spark.session import get_spark_session; "
            "from cdc_platform.spark.changelog import materialize_window; "
            "c = load_config(sys.argv[1]); t = c.table(sys.argv[2]); s = get_spark_session(c.spark); "
            "materialize_window(s, c, t, datetime.fromisoformat(sys.argv[3]), datetime.fromisoformat(sys.argv[4]))"
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                script,
                str(self.config_path),
                table.key,
                self.window_start.isoformat(),
                end.isoformat(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(self.rng.uniform(6.0, 14.0))  # Spark is up and reading or writing by now
        proc.kill()  # SIGKILL: no cleanup, whatever was half-written stays
        proc.wait(timeout=30)
        self.killed_window = (self.window_start, end)  # the driver re-runs exactly this window
        return 1

    def bad_records(self, malformed: int = 5) -> int:
        from confluent_kafka import Producer

        table = self.tables[1]
        producer = Producer({"bootstrap.servers": self.profile.kafka_bootstrap, "message.max.bytes": 2_000_000})
        for i in range(malformed):
            producer.produce(self.config.topic_for(table), b"not json {" + bytes([i]), key=b'{"order_id": -1}')
        producer.produce(self.config.topic_for(table), b"x" * OVERSIZED_BYTES, key=b'{"order_id": -2}')
        assert producer.flush(30) == 0
        self.expected_dead += malformed + 1
        return malformed + 1

    def retention(self) -> int:
        """Records the changelog still needs are deleted (DeleteRecords): the driver sees the
        gap and rehydrates the table (a new generation), as the rehydration sensor does."""
        from confluent_kafka import Consumer, TopicPartition
        from confluent_kafka.admin import AdminClient

        table = self.tables[0]
        topic = self.config.topic_for(table)
        self.workload.running.clear()
        self.wait_caught_up()
        consumer = Consumer({"bootstrap.servers": self.profile.kafka_bootstrap, "group.id": "faults"})
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p))[1]) for p in partitions
        ]
        consumer.close()
        admin = AdminClient({"bootstrap.servers": self.profile.kafka_bootstrap})
        for future in admin.delete_records(ends).values():
            future.result(timeout=30)
        self.workload.running.set()
        return 1

    # ------------------------------------------------------------ settle and check

    def settle(self) -> tuple[int, int, int, bool, str]:
        """Pause the workload, let everything catch up, apply, verify, account."""
        from cdc_platform.spark.changelog import ChangelogGapError, materialize_window
        from cdc_platform.spark.current import apply_changes
        from cdc_platform.spark.snapshot import take_snapshot
        from cdc_platform.spark.verify import verify_table

        self.workload.running.clear()
        time.sleep(0.5)
        self.wait_caught_up()
        time.sleep(1.1)
        end = datetime.now(UTC).replace(microsecond=0)
        config = self.config
        notes = []
        if self.killed_window is not None:  # windows are fixed once: redo the killed one as it was
            for table in self.tables:
                materialize_window(self.spark, config, table, *self.killed_window)
            self.window_start, self.killed_window = self.killed_window[1], None
        for table in self.tables:
            try:
                materialize_window(self.spark, config, table, self.window_start, end)
            except ChangelogGapError:
                generation = datetime.now(UTC).strftime("g%Y%m%dT%H%M%SZ")
                take_snapshot(self.spark, config, table, generation, log_progress=lambda _m: None)
                materialize_window(self.spark, config, table, self.window_start, end)
                notes.append(f"{table.table_name}: changelog_gap -> generation {generation}")
            apply_changes(self.spark, config, table)
        self.window_start = end
        rows = mismatches = 0
        for table in self.tables:
            verdict = verify_table(self.spark, config, table, timeout_s=120, rounds=1)
            rows += verdict.source_rows
            mismatches += verdict.missing + verdict.extra + verdict.mismatches
            if verdict.note:
                notes.append(f"{table.table_name}: {verdict.note}")
        dead, balanced = self.accounting()
        self.workload.running.set()
        return rows, mismatches, dead, balanced, "; ".join(notes)

    def accounting(self) -> tuple[int, bool]:
        from delta.tables import DeltaTable

        from cdc_platform.spark.changelog import changelog_path, dead_letters_path, recorded_ranges

        config, dead_total, balanced = self.config, 0, True
        for table in self.tables:
            offsets = sum(r.end - r.start for rs in recorded_ranges(self.spark, config, table).values() for r in rs)
            events = self.spark.read.format("delta").load(changelog_path(config, table)).count()
            path = dead_letters_path(config, table)
            dead = (
                self.spark.read.format("delta").load(path).count() if DeltaTable.isDeltaTable(self.spark, path) else 0
            )
            dead_total += dead
            balanced = balanced and offsets == events + dead
        return dead_total, balanced

    def run(self, faults: list[str], capture_kills: int = 3) -> list[FaultResult]:
        results = []
        for fault in faults:
            time.sleep(self.rng.uniform(1.0, 3.0))  # the workload runs before each fault
            started = time.monotonic()
            self.log(f"fault: {fault}")
            injected = self.capture_kill(capture_kills) if fault == "capture_kill" else getattr(self, fault)()
            time.sleep(2.0)  # and during the recovery
            rows, mismatches, dead, balanced, note = self.settle()
            result = FaultResult(
                fault, injected, mismatches == 0 and dead == self.expected_dead and balanced and "did not" not in note,
                rows, mismatches, dead, self.expected_dead, balanced, round(time.monotonic() - started, 1), note,
            )  # fmt: skip
            self.log(f"  {result}")
            results.append(result)
        return results


def format_results(results: list[FaultResult]) -> str:
    header = ("fault", "injected", "recovered", "rows compared", "mismatches", "dead letters", "accounting", "s")
    rows = [
        (r.fault, str(r.injected), "yes" if r.recovered else "NO", str(r.rows_compared), str(r.mismatches),
         f"{r.dead_letters}/{r.expected_dead_letters}", "ok" if r.accounting_ok else "OFF", f"{r.seconds:.0f}")
        for r in results
    ]  # fmt: skip
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines += [f"{r.fault}: {r.note}" for r in results if r.note]
    total = sum(r.injected for r in results)
    lines.append(f"faults injected {total}, recovered {sum(r.injected for r in results if r.recovered)}")
    return "\n".join(lines)
