"""A throwaway capture setup per test: its own schema, publication, slot and topics on
the real test stack, removed afterwards (the slot above all: a forgotten slot pins WAL)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.devtools.stack.kafka import KAFKA_PASSWORD_ENV, KAFKA_SASL_USER
from cdc_platform.devtools.stack.postgres import APP_ROLE, CAPTURE_ROLE, PASSWORD_ENVS, LocalPostgres
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.base import Capture
from cdc_platform.sources.postgres.slot import drop_slot
from cdc_platform.sources.postgres.stream import CaptureStats, PostgresCapture

if TYPE_CHECKING:
    from cdc_platform.lake.apply import StreamApply


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def envelope(self) -> dict[str, Any]:
        assert self.value is not None
        data = json.loads(self.value)
        return data["payload"] if "payload" in data and "schema" in data else data

    @property
    def schema(self) -> dict[str, Any]:
        assert self.value is not None
        return dict(json.loads(self.value)["schema"])

    @property
    def lsn(self) -> int:
        return int(self.envelope["source"]["lsn"])

    @property
    def order(self) -> tuple[int, int, int]:
        """Source order: (commit LSN, change LSN) from source.sequence, then Kafka offset."""
        commit, change = json.loads(self.envelope["source"]["sequence"])
        return int(commit), int(change), self.offset


CaptureT = TypeVar("CaptureT", bound=Capture)


@contextmanager
def running_in_thread(capture: CaptureT) -> Iterator[CaptureT]:
    """``capture`` (a stream or a poller) running in a thread for the block, as the
    long-running process runs it beside the checks; stopped and joined after it."""
    worker = threading.Thread(target=capture.run, daemon=True)
    worker.start()
    try:
        yield capture
    finally:
        capture.stop()
        worker.join(timeout=60)


@dataclass
class CaptureEnv:
    profile: StackProfile
    config_path: Path
    schema: str
    prefix: str
    slot: str
    publication: str
    tables: list[str]
    messages_seen: list[Message] = field(default_factory=list)

    @property
    def config(self) -> PlatformConfig:
        return load_config(self.config_path)

    def app(self, autocommit: bool = True) -> psycopg.Connection[tuple[Any, ...]]:
        conn = psycopg.connect(
            host="127.0.0.1",
            port=self.profile.pg_port,
            user=APP_ROLE,
            password=os.environ[PASSWORD_ENVS[APP_ROLE]],
            dbname="shop",
            autocommit=autocommit,
            options=f"-c search_path={self.schema}",
        )
        return conn

    def admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        return LocalPostgres(self.profile).admin_connect("shop")

    def capture(self, **options: Any) -> PostgresCapture:
        capture = open_source(self.config, "cap").capture(CaptureSettings(**options))
        assert isinstance(capture, PostgresCapture)
        return capture

    def run_until_caught_up(self) -> CaptureStats:
        return self.capture(until_caught_up=True, give_up_after_s=60).run()

    @contextmanager
    def running_capture(self) -> Iterator[PostgresCapture]:
        """Capture streaming in a thread (its slot active) for the duration of the block."""
        with running_in_thread(self.capture(status_interval_s=1)) as capture:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.slot_active_pid() is None:
                time.sleep(0.2)
            yield capture

    def stream_apply(self, spark: Any, groups: list[str] | None = None) -> StreamApply:
        """The stream apply of the source's tables (of ``groups`` only, as ``--group`` picks
        them) in this process's Spark: what ``cdc-platform apply`` runs, without a driver of its own."""
        from cdc_platform.cli.apply import grouped_tables
        from cdc_platform.kafka.clients import KafkaClients
        from cdc_platform.lake.apply import StreamApply
        from cdc_platform.lake.ledger import Ledger
        from cdc_platform.lake.schema_registry import schema_refresh
        from cdc_platform.lake.tables import lake_table

        config = self.config
        kafka, ledger = KafkaClients(config.kafka), Ledger(config.lake.root)
        source = open_source(config, "cap", kafka)
        tables = [lake_table(config, t) for t in grouped_tables(config, ["cap"], groups)]
        return StreamApply(
            spark, ledger, kafka, tables, config.sources["cap"].apply,
            refresh=lambda t: schema_refresh(ledger, source, t.config),
        )  # fmt: skip

    def slot_active_pid(self) -> int | None:
        with self.admin() as admin:
            row = admin.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
            ).fetchone()
        return int(row[0]) if row and row[0] else None

    def configure_table(self, table: str, settings: str) -> None:
        """Add YAML settings (one line, e.g. 'changelog: {grace_s: 0}') to a table's entry."""
        entry = f"  - name: cap.{self.schema}.{table}\n"
        self.config_path.write_text(self.config_path.read_text().replace(entry, f"{entry}    {settings}\n"))

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{self.schema}.{table}"

    def consume(self, tables: Sequence[str] | None = None, idle_s: float = 1.5) -> list[Message]:
        """Every record now in the tables' topics (all partitions, from the beginning)."""
        return consume_topics(self.profile.kafka_bootstrap, [self.topic(t) for t in (tables or self.tables)], idle_s)


def consume_topics(bootstrap: str, topics: Sequence[str], idle_s: float = 1.5) -> list[Message]:
    """Every record now in ``topics`` (all partitions, from the beginning)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    metadata = consumer.list_topics(timeout=10)
    assignment = [
        TopicPartition(t, p, 0) for t in topics if t in metadata.topics for p in metadata.topics[t].partitions
    ]
    consumer.assign(assignment)
    out: list[Message] = []
    eof: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 60
    last = time.monotonic()
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            if len(eof) == len(assignment) and time.monotonic() - last > idle_s:
                break
            continue
        if msg.error():
            if msg.error().code() == -191:  # _PARTITION_EOF
                eof.add((msg.topic(), msg.partition()))
            continue
        last = time.monotonic()
        out.append(Message(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return out


def pinned_engine(source_yaml: str) -> str:
    """A test source's settings with ``apply.engine: windows`` unless they choose one: the
    stream apply is the default, and these tests drive the Lake API or Dagster's window runs
    (the stream apply's own tests say ``apply: {engine: stream}``)."""
    if "    apply:" in source_yaml:
        return source_yaml
    return source_yaml.rstrip("\n") + ("\n" if source_yaml.strip() else "") + "    apply: {engine: windows}\n"


def make_capture_env(
    profile: StackProfile,
    tmp_path: Path,
    ddl: Sequence[str],
    tables: Sequence[str],
    *,
    table_yaml: str = "",
    source_yaml: str = "",
    partitions: int = 3,
    authenticated: bool = False,
) -> Iterator[CaptureEnv]:
    """A schema, tables, a slot and a publication of their own, and their config. With
    ``authenticated``, every client (capture, apply, Spark's Kafka source) reaches Kafka
    through the stack's SASL_SSL/SCRAM listener (its CA file trusted), the password from
    the environment."""
    suffix = uuid.uuid4().hex[:8]
    env = CaptureEnv(
        profile=profile,
        config_path=tmp_path / "cdc_platform.yaml",
        schema=f"t_{suffix}",
        prefix=f"cap{suffix}",
        slot=f"slot_{suffix}",
        publication=f"pub_{suffix}",
        tables=list(tables),
    )
    ident = sql.Identifier
    with env.admin() as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident(env.schema), ident(APP_ROLE)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident(env.schema), ident(CAPTURE_ROLE)))
    with env.app() as app:
        for statement in ddl:
            app.execute(statement.encode())
        app.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(ident(env.schema), ident(CAPTURE_ROLE))
        )
        app.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                ident(env.publication), sql.SQL(", ").join(ident(env.schema, t) for t in tables)
            )
        )
    table_entries = table_yaml or "".join(f"  - name: cap.{env.schema}.{t}\n" for t in tables)
    source_yaml = pinned_engine(source_yaml)
    env.config_path.write_text(
        f"""
sources:
  cap:
    port: {profile.pg_port}
    database: shop
    user: cdc_capture
    password_env: CDC_PG_PASSWORD
    slot_name: {env.slot}
    publication: {env.publication}
    topic_prefix: {env.prefix}
    heartbeat_interval_s: 1
{source_yaml}
kafka:
{_kafka_yaml(profile, authenticated)}
  partitions: {partitions}
lake:
  root: lake
tables:
{table_entries}"""
    )
    try:
        yield env
    finally:
        with env.admin() as admin:
            _drop_slot(admin, env.slot)
            admin.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(ident(env.publication)))
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident(env.schema)))
        admin_client = AdminClient({"bootstrap.servers": profile.kafka_bootstrap})
        existing = admin_client.list_topics(timeout=10).topics
        doomed = [t for t in existing if t.startswith(env.prefix + ".") or t.endswith("." + env.prefix)]
        if doomed:
            for future in admin_client.delete_topics(doomed).values():
                future.result(timeout=30)


def _kafka_yaml(profile: StackProfile, authenticated: bool) -> str:
    if not authenticated:
        return f"  bootstrap_servers: {profile.kafka_bootstrap}"
    return (
        f"  bootstrap_servers: {profile.kafka_sasl_bootstrap}\n"
        "  options: {security.protocol: SASL_SSL, sasl.mechanism: SCRAM-SHA-512, "
        f"sasl.username: {KAFKA_SASL_USER}, ssl.ca.location: '{profile.kafka_ca_file}'}}\n"
        f"  secret_options_env: {{sasl.password: {KAFKA_PASSWORD_ENV}}}"
    )


def _drop_slot(admin: psycopg.Connection[tuple[Any, ...]], slot: str) -> None:
    """End the backend streaming from the slot, wait until it let go, drop it."""
    drop_slot(admin, slot, terminate_user=True)
