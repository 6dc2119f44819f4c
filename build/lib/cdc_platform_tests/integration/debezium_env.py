"""A real Debezium PostgreSQL connector (Kafka Connect standalone on the test stack) as the
producer of a ``CaptureEnv``'s topics: same slot, publication, topic prefix and tables as
the platform's own capture would use, so every lake test can swap the producer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cdc_platform.config.producers import DEBEZIUM_RULES
from cdc_platform.devtools.stack.connect import DEBEZIUM_POSTGRES, ConnectRest
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform_tests.integration.capture_env import CaptureEnv, consume_topics

HEARTBEAT_TABLE = "dbz_heartbeat"
HEARTBEAT_SQL = (
    "INSERT INTO {schema}.dbz_heartbeat (id, ts) VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET ts = now()"
)


def debezium_connector_config(env: CaptureEnv, *, schemas: bool = True, **overrides: str | None) -> dict[str, str]:
    """What README "Producing with Debezium" documents, for this env's source (an override
    of None removes the setting: Debezium's default applies)."""
    tables = ",".join(f"{env.schema}.{t}" for t in env.tables)
    config = {
        "connector.class": DEBEZIUM_POSTGRES,
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(env.profile.pg_port),
        "database.user": "cdc_capture",
        "database.password": "${env:CDC_PG_PASSWORD}",  # resolved by the worker, never in a file
        "database.dbname": "shop",
        "topic.prefix": env.prefix,
        "plugin.name": "pgoutput",
        "slot.name": env.slot,
        "publication.name": env.publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": tables,
        "snapshot.mode": "no_data",  # the platform takes its own generations
        "skipped.operations": "none",  # truncates too (Debezium skips them by default)
        "heartbeat.interval.ms": "1000",
        # a quiet database: the heartbeat writes to a published table, so the slot moves on
        "heartbeat.action.query": HEARTBEAT_SQL.format(schema=env.schema),
        # heartbeat and any other topic Connect needs (the broker does not auto-create)
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        "decimal.handling.mode": "string",
        "interval.handling.mode": "string",
        "time.precision.mode": "adaptive_time_microseconds",
        "binary.handling.mode": "base64",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": str(schemas).lower(),
        "value.converter.schemas.enable": str(schemas).lower(),
    }
    merged: dict[str, str | None] = {**config, **overrides}
    return {k: v for k, v in merged.items() if v is not None}


@dataclass
class DebeziumProducer:
    env: CaptureEnv
    rest: ConnectRest
    name: str

    def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        """Until the connector's slot confirmed the database's current WAL position (its
        heartbeat moves it on a quiet database) and every record is in Kafka."""
        with self.env.admin() as admin:
            target = admin.execute("SELECT pg_current_wal_lsn()").fetchone()
            assert target is not None
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                    (target[0], self.env.slot),
                ).fetchone()
                if row and row[0]:
                    time.sleep(0.5)  # records before the flush confirmation are acknowledged by Kafka
                    return
                time.sleep(0.3)
        raise AssertionError(f"Debezium's slot {self.env.slot} did not confirm {target[0]} in {timeout_s} s")

    def messages(self) -> list[Any]:
        return consume_topics(self.env.profile.kafka_bootstrap, [self.env.topic(t) for t in self.env.tables])

    def wait_for_events(self, count: int, timeout_s: float = 60.0) -> list[Any]:
        """Until the tables' topics hold ``count`` change events (tombstones not counted)."""
        deadline = time.monotonic() + timeout_s
        events: list[Any] = []
        while time.monotonic() < deadline:
            events = [m for m in self.messages() if m.value is not None]
            if len(events) >= count:
                return events
            time.sleep(0.3)
        raise AssertionError(f"Debezium wrote {len(events)} of {count} events in {timeout_s} s")


@contextmanager
def debezium_producing(
    env: CaptureEnv, rest: ConnectRest, *, schemas: bool = True, **overrides: str | None
) -> Iterator[DebeziumProducer]:
    """The connector running for the block, topics created the platform's way first (same
    partitions as its own capture); the connector is removed afterwards, the slot by the env."""
    name = f"dbz-{env.prefix}"
    config = debezium_connector_config(env, schemas=schemas, **overrides)
    declare_debezium_producer(env, name, rest.url, config)
    KafkaClients(env.config.kafka).ensure_topics([env.topic(t) for t in env.tables])
    _published_heartbeat_table(env)
    rest.put_connector(name, config)
    try:
        rest.wait_running(name)
        producer = DebeziumProducer(env, rest, name)
        _wait_for_slot(env)
        yield producer
    finally:
        rest.delete_connector(name)
        _wait_slot_released(env)


def declare_debezium_producer(env: CaptureEnv, connector: str, connect_url: str, config: dict[str, str]) -> None:
    """The platform's config says who writes the topics, with the connector's settings the
    lake depends on; and Debezium's topics use cleanup.policy=delete (a truncate has no key,
    which a compacted topic refuses)."""
    settings = "".join(f"        {key}: {json.dumps(config[key])}\n" for key in sorted(DEBEZIUM_RULES) if key in config)
    producer = (
        f"    producer:\n      kind: debezium\n      connector: {connector}\n      connect_url: {connect_url}\n"
        f"      settings:\n{settings}"
    )
    text = env.config_path.read_text()
    if "producer:" not in text:
        text = text.replace("    heartbeat_interval_s: 1\n", producer, 1)
        text = text.replace("\nkafka:\n", "\nkafka:\n  cleanup_policy: delete\n", 1)
        env.config_path.write_text(text)


def _published_heartbeat_table(env: CaptureEnv) -> None:
    """Debezium's documented fix for quiet databases: its heartbeat query writes a row to a
    table in the publication (not in table.include.list), so its slot advances."""
    from psycopg import sql

    with env.app() as app:
        app.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, ts timestamptz)").format(
                sql.Identifier(env.schema, HEARTBEAT_TABLE)
            )
        )
        app.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO cdc_capture").format(
                sql.Identifier(env.schema, HEARTBEAT_TABLE)
            )
        )
        published = app.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND tablename = %s",
            (env.publication, HEARTBEAT_TABLE),
        ).fetchone()
        if not published:
            app.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(env.publication), sql.Identifier(env.schema, HEARTBEAT_TABLE)
                )
            )


def _wait_for_slot(env: CaptureEnv, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if env.slot_active_pid() is not None:
            return
        time.sleep(0.3)
    raise AssertionError(f"Debezium did not start streaming from slot {env.slot} within {timeout_s} s")


def _wait_slot_released(env: CaptureEnv, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and env.slot_active_pid() is not None:
        time.sleep(0.3)
