"""Capture against the real stack: envelopes, order, keys, types, topics, heartbeats."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from cdc_platform.envelope.debezium import UNAVAILABLE
from cdc_platform.envelope.decode import field_schemas, from_connect
from cdc_platform.envelope.partitioner import partition_for
from cdc_platform.envelope.pgtypes import parse_array
from cdc_platform_tests.cases.pg_types import TYPE_CASES, type_cases_ddl
from cdc_platform_tests.integration.capture_env import CaptureEnv, Message, make_capture_env

pytestmark = pytest.mark.integration

ITEMS_DDL = [
    "CREATE TABLE items (id int PRIMARY KEY, body text, qty int NOT NULL DEFAULT 0)",
    "CREATE TABLE notes (id bigint PRIMARY KEY, item_id int, note text)",
]


@pytest.fixture
def items_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, ITEMS_DDL, ["items", "notes"])


def _in_source_order(messages: list[Message]) -> list[Message]:
    return sorted((m for m in messages if m.value is not None), key=lambda m: m.order)


def test_changes_become_envelopes_in_source_order(items_env: CaptureEnv) -> None:
    env = items_env
    env.run_until_caught_up()  # creates slot, publication check, topics
    with env.app(autocommit=False) as app:  # one multi-table transaction
        app.execute("INSERT INTO items (id, body, qty) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        app.execute("INSERT INTO notes VALUES (10, 1, 'first note')")
        app.commit()
        app.execute("UPDATE items SET qty = qty + 10 WHERE id = 1")
        app.commit()
        app.execute("UPDATE items SET id = 20 WHERE id = 2")  # primary-key update
        app.commit()
        app.execute("DELETE FROM items WHERE id = 3")
        app.execute("UPDATE items SET body = 'uno' WHERE id = 1")  # same transaction as the delete
        app.commit()
        app.execute("TRUNCATE notes")
        app.commit()
    stats = env.run_until_caught_up()
    assert stats.transactions == 5

    items = env.consume(["items"])
    ordered = [(m.envelope["op"], json.loads(m.key or b"null")) for m in _in_source_order(items)]
    assert ordered == [
        ("c", {"id": 1}),
        ("c", {"id": 2}),
        ("c", {"id": 3}),
        ("u", {"id": 1}),
        ("d", {"id": 2}),
        ("c", {"id": 20}),
        ("d", {"id": 3}),
        ("u", {"id": 1}),
    ]
    by_op = [m.envelope for m in _in_source_order(items)]
    assert by_op[0]["after"] == {"id": 1, "body": "one", "qty": 1}
    assert by_op[3]["after"] == {"id": 1, "body": "one", "qty": 11} and by_op[3]["before"] is None
    assert by_op[6]["before"] == {"id": 3, "body": None, "qty": None}  # REPLICA IDENTITY DEFAULT: key only
    # the first transaction's events share its txId and commit LSN
    first_tx = {(e["source"]["txId"], json.loads(e["source"]["sequence"])[0]) for e in by_op[:3]}
    assert len(first_tx) == 1
    # deletes are followed by a tombstone for the same key, in the same partition
    for delete in (m for m in items if m.value and m.envelope["op"] == "d"):
        tombstones = [m for m in items if m.value is None and m.key == delete.key]
        assert len(tombstones) == 1
        assert tombstones[0].partition == delete.partition and tombstones[0].offset > delete.offset

    notes = env.consume(["notes"])
    truncates = [m for m in notes if m.value and m.envelope["op"] == "t"]
    assert sorted(m.partition for m in truncates) == [0, 1, 2]  # every partition sees it
    assert all(m.key == b'{"id":null}' for m in truncates)
    creates = [m for m in notes if m.value and m.envelope["op"] == "c"]
    assert creates[0].envelope["source"]["txId"] == by_op[0]["source"]["txId"]


def test_keys_are_byte_stable_and_partitioned_like_java(items_env: CaptureEnv) -> None:
    env = items_env
    env.run_until_caught_up()
    with env.app() as app:
        for i in range(1, 31):
            app.execute("INSERT INTO items (id, body) VALUES (%s, 'x')", (i,))
        for i in range(1, 31):
            app.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (i,))
        app.execute("DELETE FROM items WHERE id <= 10")
    env.run_until_caught_up()
    messages = env.consume(["items"])
    keys_by_row: dict[int, set[bytes]] = defaultdict(set)
    partitions_by_row: dict[int, set[int]] = defaultdict(set)
    for m in messages:
        assert m.key is not None
        row = json.loads(m.key)
        assert set(row) == {"id"}  # exactly the primary key: no op, no timestamp
        keys_by_row[row["id"]].add(m.key)
        partitions_by_row[row["id"]].add(m.partition)
        assert m.partition == partition_for(m.key, 3)  # librdkafka murmur2_random == Java's partitioner
    assert len(keys_by_row) == 30
    assert all(len(k) == 1 for k in keys_by_row.values())
    assert all(len(p) == 1 for p in partitions_by_row.values())
    assert len({p for ps in partitions_by_row.values() for p in ps}) == 3


def test_topics_are_created_compacted_with_the_configured_partitions(items_env: CaptureEnv) -> None:
    env = items_env
    env.run_until_caught_up()
    admin = AdminClient({"bootstrap.servers": env.profile.kafka_bootstrap})
    metadata = admin.list_topics(timeout=10)
    topic = env.topic("items")
    assert len(metadata.topics[topic].partitions) == 3
    [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert future.result(timeout=10)["cleanup.policy"].value == "compact"
    assert f"__debezium-heartbeat.{env.prefix}" in metadata.topics


# -- types ---------------------------------------------------------------------------------------


@pytest.fixture
def types_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(
        demo_db, tmp_path, type_cases_ddl(), ["type_cases"], source_yaml="    envelope_schemas: true\n"
    )


def _expected(value: Any) -> Any:
    """PostgreSQL's value (as psycopg reads it) in the form the envelope decodes to."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, ipaddress.IPv4Interface | ipaddress.IPv4Address | uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


def test_every_type_case_round_trips_exactly(types_env: CaptureEnv) -> None:
    env = types_env
    env.run_until_caught_up()
    with env.app() as app:
        for name, _, literal in TYPE_CASES:
            app.execute(f"INSERT INTO type_cases (case_name, {name}) VALUES ('{name}', {literal})".encode())
    env.run_until_caught_up()
    messages = {json.loads(m.key or b"")["payload"]["case_name"]: m for m in env.consume() if m.value}
    assert set(messages) == {name for name, _, _ in TYPE_CASES}

    with env.app() as app:
        app.execute("SET intervalstyle = iso_8601")
        interval_cols = {n for n, t, _ in TYPE_CASES if t == "interval"}
        json_cols = {n for n, t, _ in TYPE_CASES if t in ("json", "jsonb")}
        timetz_cols = {n for n, t, _ in TYPE_CASES if t == "time with time zone"}
        problems = []
        for name, sqltype, _ in TYPE_CASES:
            cast = "::text" if name in interval_cols | timetz_cols else ""
            row = app.execute(
                f"SELECT {name}{cast}, {name}::text FROM type_cases WHERE case_name = %s".encode(), (name,)
            ).fetchone()
            assert row is not None
            actual_value, as_text = row
            message = messages[name]
            schema = field_schemas(message.schema["fields"] and message.schema)[name]
            captured = message.envelope["after"][name]
            decoded = from_connect(captured, schema)
            if name in json_cols:
                ok = json.loads(decoded) == json.loads(as_text) and (sqltype == "jsonb" or decoded == as_text)
            elif name in timetz_cols:
                ok = decoded == "04:30:00.25Z"  # 10:00:00.25+05:30 in UTC, Debezium's ZonedTime
            elif name in interval_cols:
                ok = decoded == actual_value  # ISO 8601 text, exactly as PostgreSQL prints it
            elif sqltype == "real":
                ok = Decimal(repr(decoded)) == Decimal(as_text)  # the same shortest-exact digits
            elif sqltype.endswith("[]") and isinstance(actual_value, str):
                ok = decoded == parse_array(actual_value)  # psycopg has no loader for enum arrays
            else:
                ok = decoded == _expected(actual_value)
            if not ok:
                problems.append(f"{name} ({sqltype}): captured {captured!r} -> {decoded!r}; postgres {as_text!r}")
            # every other column of the row is null
            others = {k: v for k, v in message.envelope["after"].items() if k not in (name, "case_name")}
            assert set(others.values()) == {None}, name
    assert not problems, "\n".join(problems)


# -- TOAST ---------------------------------------------------------------------------------------


@pytest.fixture
def toast_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    ddl = [
        "CREATE TABLE docs_default (id int PRIMARY KEY, body text, n int)",
        "CREATE TABLE docs_full (id int PRIMARY KEY, body text, n int)",
        "ALTER TABLE docs_full REPLICA IDENTITY FULL",
        # store uncompressed out of line, so even a moderate value is TOASTed
        "ALTER TABLE docs_default ALTER COLUMN body SET STORAGE EXTERNAL",
        "ALTER TABLE docs_full ALTER COLUMN body SET STORAGE EXTERNAL",
    ]
    yield from make_capture_env(demo_db, tmp_path, ddl, ["docs_default", "docs_full"])


def test_unchanged_toast_values_never_arrive_as_nulls(toast_env: CaptureEnv) -> None:
    env = toast_env
    env.run_until_caught_up()
    body = "lorem ipsum " * 2000  # ~24 kB: TOASTed
    with env.app() as app:
        for table in ("docs_default", "docs_full"):
            app.execute(f"INSERT INTO {table} VALUES (1, %s, 0)".encode(), (body,))
            app.execute(f"UPDATE {table} SET n = 1 WHERE id = 1".encode())  # body unchanged: not re-sent
    env.run_until_caught_up()
    updates = {m.topic.rsplit(".", 1)[1]: m.envelope for m in env.consume() if m.value and m.envelope["op"] == "u"}
    # REPLICA IDENTITY FULL: the old row carries the value, so the event is exact
    assert updates["docs_full"]["after"]["body"] == body
    # DEFAULT: PostgreSQL does not send it; the placeholder (never null) marks "unchanged"
    assert updates["docs_default"]["after"]["body"] == UNAVAILABLE
    assert updates["docs_default"]["after"]["n"] == 1


# -- heartbeats ---------------------------------------------------------------------------------


def test_heartbeat_advances_the_slot_while_captured_tables_are_idle(items_env: CaptureEnv) -> None:
    env = items_env
    with env.running_capture() as capture:
        with env.app() as app:
            app.execute("CREATE TABLE noise (id serial PRIMARY KEY, pad text)")  # not in the publication
            start = _confirmed(env)
            for _ in range(20):
                app.execute("INSERT INTO noise (pad) SELECT repeat('x', 500) FROM generate_series(1, 200)")
            row = app.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (start,)).fetchone()
            assert row is not None and int(row[0]) > 1_000_000  # the busy database wrote > 1 MB of WAL
            target = app.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert target is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with env.admin() as admin:
                caught = admin.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (target[0], env.slot),
                ).fetchone()
            if caught and caught[0]:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"slot stayed at {_confirmed(env)} while WAL moved to {target[0]}")
        assert capture.stats.events.total() == 0  # nothing captured: the slot moved on heartbeats alone


def _confirmed(env: CaptureEnv) -> str:
    with env.admin() as admin:
        row = admin.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (env.slot,)
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def authenticated_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, ITEMS_DDL, ["items"], authenticated=True)


def test_a_password_kafka_refuses_stops_capture_at_once_naming_the_fix(
    authenticated_env: CaptureEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the SASL_SSL/SCRAM listener, capture delivers; with a password the broker
    refuses, librdkafka's calls only time out ("transport failure"), which alone would be
    retried forever. The refusal is fatal instead, at once, naming the settings to fix and
    never the password."""
    from cdc_platform.devtools.stack.kafka import KAFKA_PASSWORD_ENV
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform.model.errors import FatalError

    env = authenticated_env
    env.run_until_caught_up()  # creates the slot and the topics, through the SASL listener
    with env.app() as app:
        app.execute("INSERT INTO items (id, body) SELECT g, 'x' FROM generate_series(1, 20) g")
    assert env.run_until_caught_up().events["c"] == 20  # the right password: delivered

    wrong = f"not-{uuid.uuid4().hex}"
    monkeypatch.setenv(KAFKA_PASSWORD_ENV, wrong)
    started = time.monotonic()
    with pytest.raises(FatalError) as refused:
        env.run_until_caught_up()
    assert time.monotonic() - started < 10  # not a retry loop, nor a wait for the whole timeout
    with pytest.raises(FatalError) as asked:  # the apply's first question: the offsets
        KafkaClients(env.config.kafka).end_offsets(env.topic("items"))
    for error in (refused.value, asked.value):
        text = str(error)
        assert "refused the client's credentials" in text and "kafka.secret_options_env" in text, text
        assert wrong not in text


class LateForwarder:
    """A loopback port that refuses connections until ``open()``, then forwards each one to
    ``target_port``: a database that is not up yet when capture starts."""

    def __init__(self, target_port: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.target_port = target_port
        self.server: socket.socket | None = None

    def open(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.server,), daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def _accept(self, server: socket.socket) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                client, _ = server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_a_database_not_up_when_capture_starts_is_waited_for_with_backoff(items_env: CaptureEnv) -> None:
    """Capture started while its database does not answer yet (a host rebooting, a failover)
    retries with backoff, as it does once streaming, then streams: an unreachable database
    is retriable at any moment, not fatal when it happens before the first change."""
    env = items_env
    env.run_until_caught_up()  # the slot and the topics exist
    with env.app() as app:
        app.execute("INSERT INTO items (id, body) SELECT g, 'x' FROM generate_series(1, 5) g")
    forwarder = LateForwarder(env.profile.pg_port)
    text = env.config_path.read_text()
    assert text.count(f"port: {env.profile.pg_port}") == 1  # the source's
    env.config_path.write_text(text.replace(f"port: {env.profile.pg_port}", f"port: {forwarder.port}"))
    capture = env.capture(until_caught_up=True, give_up_after_s=60, max_reconnect_wait_s=1)
    opening = threading.Timer(3.0, forwarder.open)
    opening.start()
    started = time.monotonic()
    try:
        stats = capture.run()
    finally:
        opening.cancel()
        forwarder.close()
    assert time.monotonic() - started >= 3.0
    assert stats.reconnects >= 1
    assert stats.events.get("c") == 5
