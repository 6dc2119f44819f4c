"""Capture under faults: SIGKILL at random instants, dropped connections, and the fatal
errors that must stop capture with a message naming the fix."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.model.errors import FatalError, SlotLostError
from cdc_platform.sources.postgres.errors import classify_postgres_error
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration

DDL = [
    "CREATE TABLE items (id int PRIMARY KEY, body text, qty int NOT NULL DEFAULT 0)",
    "CREATE TABLE lines (order_id int, line_no int, note text, PRIMARY KEY (order_id, line_no))",
]


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"])


class Workload(threading.Thread):
    """Steady random inserts, updates, deletes and key updates on both tables, for
    ``seconds`` or, without them, until ``stop()``: tests that must overlap an event drive
    it until that event has happened, whatever the machine's speed."""

    def __init__(
        self, env: CaptureEnv, seconds: float | None, seed: int, first_id: int = 1, pause_s: float = 0.004
    ) -> None:
        super().__init__(daemon=True)
        self.env, self.seconds, self.rng = env, seconds, random.Random(seed)
        self.first_id, self.pause_s = first_id, pause_s
        self.transactions = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def wait_for(self, transactions: int, timeout_s: float = 120.0) -> None:
        """Until ``transactions`` more have committed."""
        target, deadline = self.transactions + transactions, time.monotonic() + timeout_s
        while self.transactions < target and self.error is None:
            assert time.monotonic() < deadline, f"the workload committed {self.transactions} of {target} transactions"
            time.sleep(0.05)

    def run(self) -> None:
        try:
            with self.env.app(autocommit=False) as app:
                next_id = self.first_id
                deadline = time.monotonic() + self.seconds if self.seconds is not None else float("inf")
                while time.monotonic() < deadline and not self._halt.is_set():
                    for _ in range(self.rng.randint(1, 4)):  # multi-statement transactions
                        roll = self.rng.random()
                        target = self.rng.randint(self.first_id, max(next_id, self.first_id + 1))
                        if roll < 0.45:
                            app.execute("INSERT INTO items (id, body) VALUES (%s, md5(random()::text))", (next_id,))
                            app.execute("INSERT INTO lines VALUES (%s, 1, 'n')", (next_id,))
                            next_id += 1
                        elif roll < 0.75:
                            app.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (target,))
                        elif roll < 0.85:
                            app.execute(
                                "UPDATE lines SET line_no = line_no + 1 WHERE order_id = %s", (target,)
                            )  # key update
                        else:
                            app.execute("DELETE FROM items WHERE id = %s", (target,))
                    app.commit()
                    self.transactions += 1
                    time.sleep(self.pause_s)
        except BaseException as exc:
            self.error = exc


def _capture_process(env: CaptureEnv, *extra: str) -> subprocess.Popen[bytes]:
    cli = Path(sys.executable).parent / "cdc-platform"
    return subprocess.Popen(
        [str(cli), "capture", "run", "--config", str(env.config_path), "--source", "cap", *extra],
        stdout=subprocess.DEVNULL,
        stderr=open(env.config_path.parent / "capture.log", "ab"),
        env={**os.environ},
    )


def _truth(env: CaptureEnv, slot: str) -> set[int]:
    """LSNs of every committed change to the tables, from an independent test_decoding slot."""
    with env.admin() as admin:
        rows = admin.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,)
        ).fetchall()
    from cdc_platform.envelope.lsn import parse_lsn

    prefixes = tuple(f"table {env.schema}.{t}:" for t in env.tables)
    return {parse_lsn(str(lsn)) for lsn, data in rows if str(data).startswith(prefixes)}


def test_sigkill_at_random_instants_loses_nothing(env: CaptureEnv) -> None:
    env.run_until_caught_up()  # slot, publication and topics exist before the workload starts
    truth_slot = f"truth_{uuid.uuid4().hex[:8]}"
    with env.admin() as admin:
        admin.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (truth_slot,))
    try:
        rng = random.Random(2024)
        workload = Workload(env, seconds=14, seed=7)
        workload.start()
        kills = 0
        while workload.is_alive():
            proc = _capture_process(env)
            time.sleep(rng.uniform(1.5, 3.5))
            if proc.poll() is not None:
                pytest.fail(f"capture exited early ({proc.returncode}); see {env.config_path.parent / 'capture.log'}")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            kills += 1
        workload.join()
        assert workload.error is None, workload.error
        assert kills >= 3 and workload.transactions > 300
        # then run to the end of the log
        final = _capture_process(env, "--until-caught-up")
        assert final.wait(timeout=180) == 0, (env.config_path.parent / "capture.log").read_text()[-3000:]

        truth = _truth(env, truth_slot)
        messages = env.consume()
        published = {m.lsn for m in messages if m.value is not None and m.envelope["op"] != "t"}
        assert truth, "the ground truth saw no changes: the check would be vacuous"
        missing = sorted(truth - published)
        assert not missing, f"{len(missing)} committed changes never reached Kafka, e.g. {missing[:5]}"
        assert not published - truth, "Kafka holds changes the database never committed"

        # duplicates (re-sent after a kill) are allowed, but each partition's first
        # occurrences are in source order
        by_partition: dict[tuple[str, int], list[Any]] = {}
        for m in sorted(messages, key=lambda m: (m.topic, m.partition, m.offset)):
            if m.value is not None:
                by_partition.setdefault((m.topic, m.partition), []).append(m)
        duplicates = 0
        for records in by_partition.values():
            seen: set[tuple[int, str, bytes | None]] = set()
            firsts = []
            for m in records:
                ident = (m.lsn, m.envelope["op"], m.key)
                if ident in seen:
                    duplicates += 1
                    continue
                seen.add(ident)
                firsts.append(m.order[:2])
            assert firsts == sorted(firsts)
        print(f"kills={kills} transactions={workload.transactions} changes={len(truth)} duplicates={duplicates}")
    finally:
        with env.admin() as admin:
            admin.execute("SELECT pg_drop_replication_slot(%s)", (truth_slot,))


def test_reconnects_when_the_connection_is_killed(env: CaptureEnv) -> None:
    with env.running_capture() as capture, env.app() as app:
        app.execute("INSERT INTO items (id) SELECT g FROM generate_series(1, 100) g")
        with env.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (env.slot_active_pid(),))
        app.execute("INSERT INTO items (id) SELECT g FROM generate_series(101, 200) g")
        # wait for what Kafka holds, not for capture's event count: the count includes the
        # changes a new session sends again (at least once), so it can reach 200 while the
        # second insert is half-way (the walsender dies asynchronously, mid-transaction)
        deadline = time.monotonic() + 90
        ids: set[int] = set()
        while time.monotonic() < deadline and ids != set(range(1, 201)):
            ids = {json.loads(m.key or b"")["id"] for m in env.consume(["items"], idle_s=0.5) if m.value}
    assert capture.stats.reconnects >= 1
    assert ids == set(range(1, 201))


@pytest.mark.serial  # the broker goes down under every other test: run alone (scripts/test.sh)
def test_survives_a_kafka_restart(env: CaptureEnv) -> None:
    from cdc_platform.devtools.stack.kafka import LocalKafka
    from cdc_platform.devtools.stack.stack import stack_env

    kafka, secrets = LocalKafka(env.profile), stack_env(env.profile)
    try:
        with env.running_capture() as capture, env.app() as app:
            app.execute("INSERT INTO items (id) SELECT g FROM generate_series(1, 100) g")
            assert kafka.down()  # the broker goes away mid-stream…
            app.execute("INSERT INTO items (id) SELECT g FROM generate_series(101, 200) g")
            time.sleep(3)
            kafka.up(secrets)  # …and comes back
            app.execute("INSERT INTO items (id) SELECT g FROM generate_series(201, 300) g")
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and capture.stats.events["c"] < 300:
                time.sleep(0.5)
    finally:
        kafka.up(secrets)  # whatever happened, leave the broker running for the next tests
    ids = {json.loads(m.key or b"")["id"] for m in env.consume(["items"]) if m.value}
    assert ids == set(range(1, 301))


# -- fatal errors ------------------------------------------------------------------------------


def test_bad_credentials(env: CaptureEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_PG_PASSWORD", "not-the-password-42")
    with pytest.raises(FatalError) as info:
        env.run_until_caught_up()
    assert "bad credentials for user cdc_capture" in str(info.value)
    assert "password_env" in str(info.value)
    assert "not-the-password-42" not in str(info.value)


def test_missing_table(env: CaptureEnv) -> None:
    text = env.config_path.read_text().replace(f"cap.{env.schema}.lines", f"cap.{env.schema}.linez")
    env.config_path.write_text(text)
    with pytest.raises(FatalError, match=rf'table {env.schema}.linez does not exist in database "shop"'):
        env.run_until_caught_up()


def test_missing_publication_privileges(env: CaptureEnv) -> None:
    other = f"pub_missing_{uuid.uuid4().hex[:6]}"
    env.config_path.write_text(env.config_path.read_text().replace(env.publication, other))
    with pytest.raises(FatalError) as info:
        env.run_until_caught_up()
    message = str(info.value)
    assert f"role cdc_capture may not create or change publication {other}" in message
    assert "as a superuser, or as the role that owns the table(s) (shop_app), run: " in message
    statement = message.split(", run: ")[1]
    assert statement.startswith(f'CREATE PUBLICATION "{other}" FOR TABLE')
    with env.app() as app:  # the tables' owner can run it
        app.execute(statement.encode())
    env.run_until_caught_up()
    with env.admin() as admin:
        admin.execute(f'DROP PUBLICATION "{other}"'.encode())


def test_adding_a_table_names_who_may_alter_the_publication(env: CaptureEnv) -> None:
    """The publication belongs to an admin role (as in the demo); its tables to the app:
    the advice must name a role that can run the statement, and the statement must work."""
    with env.admin() as admin:
        admin.execute(f"CREATE TABLE {env.schema}.extra (id int PRIMARY KEY)".encode())
        admin.execute(f"ALTER TABLE {env.schema}.extra OWNER TO shop_app".encode())
        admin.execute(f"GRANT SELECT ON {env.schema}.extra TO cdc_capture".encode())
        admin.execute(f'ALTER PUBLICATION "{env.publication}" OWNER TO cdc_admin'.encode())
    env.config_path.write_text(env.config_path.read_text() + f"  - name: cap.{env.schema}.extra\n")
    with pytest.raises(FatalError) as info:
        env.run_until_caught_up()
    message = str(info.value)
    assert "owns both publication (now cdc_admin) and the table(s) (shop_app)" in message
    statement = message.split(", run: ")[1]
    assert statement == f'ALTER PUBLICATION "{env.publication}" ADD TABLE "{env.schema}"."extra"'
    with env.admin() as admin:  # a superuser, as the message says
        admin.execute(statement.encode())
    env.run_until_caught_up()


@pytest.mark.serial  # max_slot_wal_keep_size = 1MB is server-wide: other tests' slots would be invalidated
def test_invalidated_slot_stops_with_source_position_lost(env: CaptureEnv) -> None:
    env.run_until_caught_up()  # the slot exists and is idle
    with env.admin() as admin:
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            with env.app() as app:
                app.execute("CREATE TABLE wal_filler (pad text)")
                for _ in range(4):  # move several WAL segments past the slot
                    app.execute("INSERT INTO wal_filler SELECT repeat('x', 100) FROM generate_series(1, 100)")
                    admin.execute("SELECT pg_switch_wal()")
            admin.execute("CHECKPOINT")
            status = admin.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (env.slot,))
            assert status.fetchone() == ("lost",)
        finally:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")
    with pytest.raises(SlotLostError) as info:
        env.run_until_caught_up()
    assert info.value.reason == "source_position_lost"
    assert "wal_status=lost" in str(info.value) and "rehydrated" in str(info.value)


def test_dropped_slot_is_not_silently_recreated(env: CaptureEnv) -> None:
    env.run_until_caught_up()
    # the walsender of the capture that just stopped leaves the slot a moment after it
    deadline = time.monotonic() + 15
    while env.slot_active_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    with env.admin() as admin:
        admin.execute("SELECT pg_drop_replication_slot(%s)", (env.slot,))
    with pytest.raises(SlotLostError, match="no longer exists, but capture confirmed changes"):
        env.run_until_caught_up()
    # after rehydrating, the operator starts a new slot explicitly
    env.capture(until_caught_up=True, give_up_after_s=60, new_slot=True).run()
    env.run_until_caught_up()  # and from then on it is the slot of record


@pytest.mark.parametrize(
    ("libpq_message", "expected", "fatal"),
    [
        ('FATAL:  password authentication failed for user "cdc_capture"', "bad credentials", True),
        (
            "FATAL:  must be superuser or replication role to start walsender",
            "ALTER ROLE cdc_capture REPLICATION",
            True,
        ),
        ('FATAL:  database "shopp" does not exist', "fix sources.cap.database", True),
        ('ERROR:  replication slot "s" is active for PID 123', "run only one capture per source", True),
        ("server closed the connection unexpectedly", "server closed the connection", False),
        ('connection to server at "127.0.0.1", port 5434 failed: Connection refused', "Connection refused", False),
    ],
)
def test_postgres_errors_are_classified(libpq_message: str, expected: str, fatal: bool) -> None:
    error = classify_postgres_error(Exception(libpq_message), source="cap", user="cdc_capture", slot="s")
    assert expected in str(error)
    assert error.retriable is not fatal
