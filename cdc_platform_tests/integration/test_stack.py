"""The local stack answers: PostgreSQL with logical decoding, Kafka round trips, loopback only."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.devtools.demo.workload import app_connect, run_workload
from cdc_platform.devtools.stack import StackProfile, stack_status, stack_up
from cdc_platform.devtools.stack.postgres import CAPTURE_ROLE

# serial: it writes to the demo tables other serial tests snapshot and compare
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def capture_connect(profile: StackProfile, dbname: str = "shop") -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host="127.0.0.1",
        port=profile.pg_port,
        user=CAPTURE_ROLE,
        password=os.environ["CDC_PG_PASSWORD"],
        dbname=dbname,
        autocommit=True,
    )


def test_up_is_idempotent_and_status_reports_both(stack: StackProfile) -> None:
    again = stack_up(stack)
    assert not again.started_postgres and not again.started_kafka
    status = stack_status(stack)
    assert status["postgres"].startswith("up") and "wal_level=logical" in status["postgres"]
    assert status["kafka"].startswith("up")


def test_postgres_logical_decoding_with_the_capture_role(demo_db: StackProfile) -> None:
    slot = f"t_{uuid.uuid4().hex[:12]}"
    with capture_connect(demo_db) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        # the least-privilege role can create a logical slot (REPLICATION) and read changes
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
        try:
            with app_connect(demo_db) as app:
                app.execute("UPDATE products SET name = name || '' WHERE id = 1")
            changes = [
                str(r[0])
                for r in conn.execute("SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,))
            ]
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    assert any(c.startswith("table public.products: UPDATE: id[integer]:1 ") for c in changes), changes


def test_capture_role_is_least_privilege(demo_db: StackProfile) -> None:
    with capture_connect(demo_db) as conn:
        assert conn.execute("SELECT count(*) > 0 FROM customers").fetchone() == (True,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM customers WHERE false")


def test_kafka_produce_consume_round_trip(stack: StackProfile) -> None:
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True})
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(50)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": stack.kafka_bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: dict[bytes, bytes] = {}
    partitions: dict[bytes, int] = {}
    try:
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                if len(received) == len(sent):
                    break
                continue
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None
            received[key] = value
            partitions[key] = msg.partition()
    finally:
        consumer.close()
    assert received == sent
    assert len(set(partitions.values())) > 1  # keys spread over the topic's partitions
    admin.delete_topics([topic])


# 127.0.0.1, ::ffff:127.0.0.1 as /proc/net/tcp{,6} spell them
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}


def listening(port: int) -> list[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp{,6}, no tools needed)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A = LISTEN
                found.append(address)
    return found


def test_services_listen_on_loopback_only(stack: StackProfile) -> None:
    for port in (stack.pg_port, stack.kafka_port, stack.controller_port, stack.kafka_sasl_port, stack.mariadb_port):
        addresses = listening(port)
        assert addresses, f"nothing listens on {port}"
        assert set(addresses) <= LOOPBACK, f"port {port} listens on {addresses}"


def test_demo_workload_inserts_updates_and_deletes(demo_db: StackProfile) -> None:
    with app_connect(demo_db) as conn:
        before = conn.execute("SELECT count(*) FROM orders").fetchone()
    stats = run_workload(demo_db, rate=200, seconds=3, seed=11)
    assert stats.transactions >= 100
    kinds = {key.rsplit(".", 1)[1] for key, n in stats.rows.items() if n > 0}
    assert kinds == {"insert", "update", "delete"}
    assert stats.rows["order_lines.update"] > 0  # primary-key updates (renumbered lines)
    assert sum(n for op, n in stats.operations.items() if op.startswith("crm.")) > 0  # the polled MariaDB source
    with app_connect(demo_db) as conn:
        after = conn.execute("SELECT count(*) FROM orders").fetchone()
        assert before is not None and after is not None
        assert int(str(after[0])) - int(str(before[0])) == stats.rows["orders.insert"]
        # the workload really committed (no lost transactions)
        types = dict(
            conn.execute(
                """SELECT column_name, data_type FROM information_schema.columns
                   WHERE table_name = 'products'"""
            ).fetchall()
        )
    assert types["price"] == "numeric" and types["attributes"] == "jsonb"
    assert types["dimensions_cm"] == "ARRAY" and types["lead_time"] == "interval"


def test_pgbench_tables_are_available(demo_db: StackProfile) -> None:
    with capture_connect(demo_db, "bench") as conn:
        row = conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone()
    assert row == (100_000,)


def test_a_slot_held_by_a_streaming_client_is_dropped_after_ending_it(demo_db: StackProfile) -> None:
    """``drop_slot(terminate_user=True)`` (cleanups, rehydration's new slot): the ended
    backend lets go of the slot a moment later, and the drop must wait for that instead of
    failing with 'replication slot … is active'."""
    import subprocess
    import time

    from cdc_platform.devtools.stack.postgres import bin_dir
    from cdc_platform.sources.postgres.slot import drop_slot, read_slot

    slot = f"t_{uuid.uuid4().hex[:12]}"
    with capture_connect(demo_db) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    env = {**os.environ, "PGPASSWORD": os.environ["CDC_PG_PASSWORD"]}
    command = [str(bin_dir() / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(demo_db.pg_port), "-U", CAPTURE_ROLE,
               "-d", "shop", "--slot", slot, "--start", "-f", "/dev/null"]  # fmt: skip
    streamer = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)  # --no-loop unset: it keeps streaming
    try:
        with capture_connect(demo_db) as admin:
            deadline = time.monotonic() + 20
            while (state := read_slot(admin, slot)) is None or state.active_pid is None:
                assert time.monotonic() < deadline, "pg_recvlogical never became the slot's active user"
                time.sleep(0.1)
            drop_slot(admin, slot, terminate_user=True)
            assert read_slot(admin, slot) is None
    finally:
        streamer.kill()
        streamer.wait()
