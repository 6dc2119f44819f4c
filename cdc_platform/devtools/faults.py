"""Fault injection: break things under a steady workload, then prove the lake is still
exactly the source (``cdc-platform faults``; a trimmed run is part of the test suite).

Everything runs against a local stack profile on loopback, with its own publication,
slot and topic prefix, a lake and a Dagster instance under a work directory. Capture runs
as a separate process (so it can be SIGKILLed); the shop workload runs in a thread that
reconnects after a PostgreSQL restart, and pgbench adds write load on the same server.
The pipeline is driven the way users run it: the platform's own sensors and automation
conditions are evaluated against the instance and the runs they request are executed
(``devtools/daemon.py``); no fault is repaired by a side door.

Two engines, as configured (``apply.engine``): ``stream`` (the default, the demo's) runs
``cdc-platform apply`` as the long-running process a user runs, reporting to the same
instance; ``apply_kill`` SIGKILLs it at random instants and cuts it between the steps of
a batch (after the changelog append, after the merge). ``windows`` applies by the
changelog sensor's runs; ``spark_kill`` SIGKILLs one of them mid-run.

After each fault the workload pauses, the pipeline settles, and:
* ``verify``'s comparison passes for every table (nothing lost, no duplicate or ghost rows);
* dead letters hold exactly the bad records injected so far;
* the accounting balances: per table, the offsets covered by recorded changelog ranges
  equal the changelog's rows plus its dead letters, and no record is in the changelog twice.
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
from pathlib import Path

import dagster as dg
import psycopg

from cdc_platform.config import PlatformConfig, TableConfig, load_config
from cdc_platform.devtools.apply_process import FIRST_BATCH_TIMEOUT_S, KILLED, ApplyProcess
from cdc_platform.devtools.daemon import Daemon
from cdc_platform.devtools.demo.setup import setup_demo
from cdc_platform.devtools.demo.workload import ShopWorkload, app_connect
from cdc_platform.devtools.stack import StackProfile, stack_up
from cdc_platform.devtools.stack.kafka import LocalKafka
from cdc_platform.devtools.stack.postgres import LocalPostgres, pgbench_path
from cdc_platform.devtools.stack.stack import load_stack_env, stack_env
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import copies_of_each_record
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import lake_table
from cdc_platform.lake.verify import VerifyContext, verify_tables
from cdc_platform.model.generations import Generation
from cdc_platform.sources import open_source
from cdc_platform.sources.postgres.slot import current_wal_position, drop_slot, read_slot

TABLES = ("customers", "orders", "order_lines", "payments")
STREAM_FAULTS = ("capture_kill", "broker_restart", "postgres_restart", "apply_kill", "bad_records", "retention")
WINDOW_FAULTS = ("capture_kill", "broker_restart", "postgres_restart", "spark_kill", "bad_records", "retention")
FAULTS = {"stream": STREAM_FAULTS, "windows": WINDOW_FAULTS}
# where apply_kill cuts the process: after the changelog append (ranges recorded, current not
# merged) and after the merge (current written, its frontier not recorded)
APPLY_CUTS = ("apply.recorded", "current.merged")
OVERSIZED_BYTES = 900_000  # under the broker's 1 MB limit: it lands, and must be dead-lettered
WINDOW_S = 60  # the suite's tables use 1-minute changelog windows
UNVERIFIED = "NOT VERIFIED:"


def records_balance(offsets: int, changelog_rows: int, distinct_records: int, dead_letters: int) -> bool:
    """Every offset the ledger recorded is in the changelog or among the dead letters, and
    each changelog record is there once: a record twice and another lost would balance the
    sum alone."""
    return offsets == changelog_rows + dead_letters and distinct_records == changelog_rows


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
        self.paused = threading.Event()  # set while no transaction is in progress
        self.transactions = 0
        self.last_commit = time.time()

    def run(self) -> None:
        while not self.stopped.is_set():
            if not self.running.wait(0.2):
                self.paused.set()
                continue
            try:
                with app_connect(self.profile) as conn:
                    conn.autocommit = True
                    shop = ShopWorkload(conn, self.rng)
                    while self.running.is_set() and not self.stopped.is_set():
                        self.paused.clear()
                        shop.step()
                        self.transactions += 1
                        self.last_commit = time.time()
                        self.paused.set()
                        time.sleep(1.0 / self.rate)
            except psycopg.Error:
                time.sleep(1.0)  # the server restarts: reconnect

    def pause(self) -> None:
        self.running.clear()
        self.paused.wait(30)


class FaultSuite:
    def __init__(
        self, profile: StackProfile, workdir: Path, rate: float = 20.0, seed: int = 1,
        log: Callable[[str], None] = print, pgbench: bool = True, tables: tuple[str, ...] = TABLES,
        engine: str = "stream",
    ) -> None:  # fmt: skip
        if engine not in FAULTS:
            raise ValueError(f"unknown apply engine {engine!r}; choose from {', '.join(FAULTS)}")
        self.profile, self.workdir, self.rate, self.log, self.engine = profile, workdir, rate, log, engine
        self.rng = random.Random(seed)  # noqa: S311 - fault timing, not crypto
        self.tag = uuid.uuid4().hex[:6]
        self.pgbench = pgbench
        self.table_names = tables  # the first gets the retention fault, the second bad records and kills
        self.workload = Workload(profile, rate, seed)
        self.capture: subprocess.Popen[bytes] | None = None
        self.bench: subprocess.Popen[bytes] | None = None
        self.expected_dead = 0
        self.last_injected = 0.0  # when the suite itself last wrote to a table topic
        self.config_path = workdir / "faults.yaml"
        self.instance_dir = workdir / "dagster"
        self.instance: dg.DagsterInstance | None = None
        self.daemon: Daemon | None = None
        # the long-running apply (stream engine), reporting to the suite's Dagster instance
        reporting = {"DAGSTER_HOME": str(self.instance_dir)}
        self.apply = ApplyProcess(self.config_path, "shop", workdir / "apply.log", reporting)
        self.apply_exits: list[int] = []  # exit codes of apply processes that ended on their own

    # ------------------------------------------------------------ setup / teardown

    def setup(self) -> None:
        stack_up(self.profile)
        load_stack_env(self.profile)
        list(setup_demo(self.profile))
        with app_connect(self.profile) as app:
            app.execute(f"CREATE PUBLICATION faults_{self.tag} FOR TABLE {', '.join(self.table_names)}")
            app.commit()
        self._write_config()
        self.instance_dir.mkdir(parents=True, exist_ok=True)
        self.instance = dg.DagsterInstance.local_temp(str(self.instance_dir))
        self.daemon = Daemon(self.config_path, self.instance, self.log)
        self.start_capture()
        self.wait_caught_up()
        self.workload.start()
        self.workload.running.set()
        if self.pgbench:
            self.bench = self._start_pgbench()
        time.sleep(2)
        self.daemon.settle()  # bootstrap: the rehydration sensor takes the first generations while the workload runs
        if self.engine == "stream":
            self.apply.env.update(stack_env(self.profile))
            self.apply.start()

    def _write_config(self) -> None:
        entry = "  - name: shop.public.{}\n    errors: {{tolerance: all, dead_letter_threshold: 1000}}\n"
        # windows engine: 1-minute windows that close as soon as they end (settling waits for the minute)
        windows = "    changelog: {window: 1m, grace_s: 0}\n" if self.engine == "windows" else ""
        tables = "".join(entry.format(t) + windows for t in self.table_names)
        apply = (
            "    apply: {engine: stream, trigger_interval_s: 0.5}\n"
            if self.engine == "stream"
            else "    apply: {engine: windows}\n"
        )
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
{apply}kafka:
  bootstrap_servers: {self.profile.kafka_bootstrap}
  partitions: 3
  cleanup_policy: compact,delete
lake:
  root: lake
tables:
{tables}"""
        )

    def _start_pgbench(self) -> subprocess.Popen[bytes]:
        command = [pgbench_path(), "-h", "127.0.0.1", "-p", str(self.profile.pg_port), "-U", "shop_app", "-c", "2",
                   "-R", "50", "-T", "3600", "-n", "bench"]  # fmt: skip
        return subprocess.Popen(
            command,
            env={**os.environ, "PGPASSWORD": os.environ["SHOP_APP_PASSWORD"]},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def teardown(self) -> None:
        self.workload.stopped.set()
        self.apply.stop()
        for proc in (self.capture, self.bench):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        with LocalPostgres(self.profile).admin_connect("shop") as admin:
            drop_slot(admin, f"faults_{self.tag}", terminate_user=True)
            admin.execute(f"DROP PUBLICATION IF EXISTS faults_{self.tag}")
        if self.instance is not None:
            self.instance.dispose()

    @property
    def config(self) -> PlatformConfig:
        return load_config(self.config_path)

    @property
    def tables(self) -> list[TableConfig]:
        return list(self.config.tables)

    # ------------------------------------------------------------ processes

    def start_capture(self) -> None:
        log = (self.workdir / "capture.log").open("ab")
        command = [sys.executable, "-m", "cdc_platform.cli", "capture", "run", "--source", "shop",
                   "--config", str(self.config_path)]  # fmt: skip
        self.capture = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **stack_env(self.profile)}
        )

    def ensure_capture(self) -> None:
        if self.capture is None or self.capture.poll() is not None:
            self.start_capture()

    def wait_caught_up(self, timeout_s: float = 120.0) -> None:
        """Capture confirmed everything committed so far (restarting it if it died)."""
        deadline = time.monotonic() + timeout_s
        with LocalPostgres(self.profile).admin_connect("shop") as admin:
            target = current_wal_position(admin)
            while time.monotonic() < deadline:
                self.ensure_capture()
                slot = read_slot(admin, f"faults_{self.tag}")
                if slot is not None and slot.confirmed >= target:
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
        kafka.up(stack_env(self.profile))
        return 1

    def postgres_restart(self) -> int:
        postgres = LocalPostgres(self.profile)
        postgres.down()
        time.sleep(2)
        postgres.up(stack_env(self.profile))
        return 1

    def spark_kill(self) -> int:
        """The next changelog run the sensor requests is executed in a process of its own and
        SIGKILLed mid-run; run monitoring marks it failed and the sensor asks again."""
        assert self.daemon is not None
        self._wait_for_closed_window()
        result = self.daemon.evaluate("changelog_windows")
        requests = list(result.run_requests or [])
        if not requests:
            raise RuntimeError("spark_kill: the changelog sensor requested no window to kill")
        proc = self.daemon.launch(requests[0], {"DAGSTER_HOME": str(self.instance_dir)})
        time.sleep(self.rng.uniform(8.0, 14.0))  # Spark is up and reading or writing by now
        proc.kill()  # SIGKILL: no cleanup, whatever was half-written stays
        proc.wait(timeout=30)
        self.daemon.reap_dead_runs()
        return 1

    def apply_kill(self, times: int = 2) -> int:
        """The long-running apply, under load: SIGKILLed ``times`` at random instants once it
        applies; after the first kill it is started with a crash point for each cut, so it
        dies between two steps of a batch (after the changelog append, after the merge), then
        as usual. Returns the kills."""
        for kill in range(times):
            self.apply.wait_for_batch()
            time.sleep(self.rng.uniform(0.0, 3.0))
            self.apply.kill()
            for cut in APPLY_CUTS if kill == 0 else ():
                self.apply.start(crash_point=cut)
                code = self.apply.wait_exit(timeout_s=FIRST_BATCH_TIMEOUT_S)
                if code != KILLED:
                    raise RuntimeError(f"apply cut at {cut} exited with {code}, not {KILLED}:\n{self.apply.tail()}")
            self.apply.start()
        return times + len(APPLY_CUTS)

    def bad_records(self, malformed: int = 5) -> int:
        table = self.tables[1]
        producer = KafkaClients(self.config.kafka).producer(**{"message.max.bytes": 2_000_000})
        for i in range(malformed):
            producer.produce(self.config.topic_for(table), b"not json {" + bytes([i]), key=b'{"order_id": -1}')
        producer.produce(self.config.topic_for(table), b"x" * OVERSIZED_BYTES, key=b'{"order_id": -2}')
        assert producer.flush(30) == 0
        self.last_injected = time.time()
        self.expected_dead += malformed + 1
        return malformed + 1

    def retention(self) -> int:
        """Records the changelog still needs are deleted (DeleteRecords): the rehydration
        sensor sees the gap and takes a new generation."""
        from confluent_kafka import TopicPartition

        table = self.tables[0]
        topic = self.config.topic_for(table)
        if self.engine == "stream":  # down longer than retention: records it never read are deleted
            self.apply.stop()
            time.sleep(2.0)
        self.workload.pause()
        self.wait_caught_up()
        kafka = KafkaClients(self.config.kafka)
        ends = [TopicPartition(topic, p, end) for p, end in kafka.end_offsets(topic).items()]
        admin = kafka.admin()  # kept referenced until its futures are done
        for future in admin.delete_records(ends).values():
            future.result(timeout=30)
        self.workload.running.set()
        if self.engine == "stream":
            self.apply.start()
        return 1

    # ------------------------------------------------------------ settle and check

    def _wait_for_closed_window(self) -> None:
        """The workload paused and captured, then the minute of the last write ends: every
        record is in a closed window."""
        self.workload.pause()
        self.wait_caught_up()
        last_write = max(self.workload.last_commit, self.last_injected)
        closes_at = last_write - last_write % WINDOW_S + WINDOW_S + 1.0
        time.sleep(max(0.0, closes_at - time.time()))

    def settle(self) -> tuple[int, int, int, bool, str]:
        """Pause the workload, let the sensors, runs and the apply catch up, verify, account."""
        assert self.daemon is not None
        if self.engine == "windows":
            self._wait_for_closed_window()
        else:
            self.workload.pause()
            self.wait_caught_up()
        before = {t.key: len(self._generations(t)) for t in self.tables}
        self.daemon.reap_dead_runs()
        self.daemon.settle()
        notes = [
            f"{t.table_name}: {self._generations(t)[-1].reason} -> generation {self._generations(t)[-1].generation}"
            for t in self.tables
            if len(self._generations(t)) > before[t.key]
        ]
        if self.engine == "stream":
            self._wait_applied(notes)
        rows, mismatches = self._verify(notes)
        dead, balanced = self.accounting()
        self.workload.running.set()
        return rows, mismatches, dead, balanced, "; ".join(notes)

    def _wait_applied(self, notes: list[str], timeout_s: float = FIRST_BATCH_TIMEOUT_S + 120.0) -> None:
        """Until the running apply's current stands at the end of every table topic. An apply
        that ended on its own is a failure of the fault (noted), then started again. The
        bound: a restarted apply's cold first batch, then two more minutes to catch up."""
        config = self.config  # read once: the file does not change while it waits
        kafka, ledger = KafkaClients(config.kafka), Ledger(config.lake.root)
        deadline, behind = time.monotonic() + timeout_s, ["every table"]
        while time.monotonic() < deadline:
            if not self.apply.alive():
                self.apply_exits.append(self.apply.exit_code or 0)
                notes.append(f"{UNVERIFIED} apply exited with {self.apply.exit_code}: {self.apply.tail(500)}")
                self.apply.start()
            committed = ledger.committed_all()
            behind = [
                t.table_name
                for t in config.tables
                if not _applied_to_end(ledger, kafka, t.key, config.topic_for(t), committed.get(t.key))
            ]
            if not behind:
                return
            time.sleep(1.0)
        notes.append(f"{UNVERIFIED} apply did not reach the end of {', '.join(behind)} within {timeout_s:.0f} s")

    def _generations(self, table: TableConfig) -> list[Generation]:
        ledger = Ledger(self.config.lake.root)
        return sorted(ledger.generations(table.key).values(), key=lambda g: g.order)

    def _verify(self, notes: list[str]) -> tuple[int, int]:
        from cdc_platform.lake.session import get_spark_session

        config = self.config
        kafka = KafkaClients(config.kafka)
        ctx = VerifyContext(
            get_spark_session(config.spark, lake=config.lake),
            Ledger(config.lake.root),
            open_source(config, "shop", kafka),
            kafka,
        )
        rows = mismatches = 0
        tables = [lake_table(config, t) for t in self.tables]
        for table, verdict in zip(self.tables, verify_tables(lambda _t: ctx, tables, 120, rounds=1), strict=True):
            rows += verdict.source_rows
            mismatches += verdict.missing + verdict.extra + verdict.mismatches
            if verdict.note:
                notes.append(f"{table.table_name}: {UNVERIFIED} {verdict.note}")
        return rows, mismatches

    def accounting(self) -> tuple[int, bool]:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdc_platform.lake.session import get_spark_session

        config = self.config
        spark = get_spark_session(config.spark, lake=config.lake)
        ledger, dead_total, balanced = Ledger(config.lake.root), 0, True
        for table in self.tables:
            lake = lake_table(config, table)
            offsets = sum(r.end - r.start for rs in ledger.windows(table.key).values() for r in rs)
            changelog = spark.read.format("delta").load(lake.changelog_path)
            counted = copies_of_each_record(changelog).agg(F.sum("copies").alias("events"), F.count(F.lit(1)))
            events, records = (int(v or 0) for v in counted.first() or (0, 0))
            path = lake.dead_letters_path
            dead = spark.read.format("delta").load(path).count() if DeltaTable.isDeltaTable(spark, path) else 0
            dead_total += dead
            balanced = balanced and records_balance(offsets, events, records, dead)
        return dead_total, balanced

    def inject(self, fault: str, capture_kills: int = 3, apply_kills: int = 2) -> int:
        if fault not in FAULTS[self.engine]:
            known = ", ".join(FAULTS[self.engine])
            raise ValueError(f"fault {fault!r} is not one of the {self.engine} engine's: {known}")
        if fault == "capture_kill":
            return self.capture_kill(capture_kills)
        if fault == "apply_kill":
            return self.apply_kill(apply_kills)
        injected: int = getattr(self, fault)()
        return injected

    def run(self, faults: list[str], capture_kills: int = 3, apply_kills: int = 2) -> list[FaultResult]:
        results = []
        for fault in faults:
            time.sleep(self.rng.uniform(1.0, 3.0))  # the workload runs before each fault
            started = time.monotonic()
            self.log(f"fault: {fault}")
            injected = self.inject(fault, capture_kills, apply_kills)
            time.sleep(2.0)  # and during the recovery
            rows, mismatches, dead, balanced, note = self.settle()
            recovered = mismatches == 0 and dead == self.expected_dead and balanced and UNVERIFIED not in note
            result = FaultResult(fault, injected, recovered, rows, mismatches, dead, self.expected_dead, balanced,
                                 round(time.monotonic() - started, 1), note)  # fmt: skip
            self.log(f"  {result}")
            results.append(result)
        return results


def _applied_to_end(ledger: Ledger, kafka: KafkaClients, key: str, topic: str, committed: Generation | None) -> bool:
    """Current is of the committed generation and its frontier is the topic's end."""
    position = ledger.current(key)
    if committed is None or position is None or position.generation != committed.generation:
        return False
    ends = kafka.end_offsets(topic)
    return {p: o for p, o in position.frontier.items() if o} == {p: o for p, o in ends.items() if o}


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
