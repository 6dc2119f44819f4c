"""A throwaway polling setup per test on the real test stack: its own MariaDB database
(readable by the platform's cdc_poll user), topic prefix and config; dropped afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.devtools.stack.mariadb import POLL_ROLE, LocalMariaDB
from cdc_platform.devtools.stack.stack import stack_env
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.mysql.poller import PollingCapture
from cdc_platform_tests.integration.capture_env import Message, consume_topics, pinned_engine, running_in_thread


@dataclass
class PollingEnv:
    profile: StackProfile
    config_path: Path
    database: str
    prefix: str
    source: str = "crm"

    @contextmanager
    def db(self) -> Iterator[Any]:
        """An admin connection in this test's database (writes as the application would)."""
        conn = LocalMariaDB(self.profile).admin_connect(stack_env(self.profile))
        try:
            conn.select_db(self.database)
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                yield cur
        finally:
            conn.close()

    def write_config(self, tables_yaml: str, source_yaml: str = "") -> PlatformConfig:
        source_yaml = pinned_engine(source_yaml)
        self.config_path.write_text(
            f"""
sources:
  {self.source}:
    kind: jdbc
    port: {self.profile.mariadb_port}
    database: {self.database}
    user: {POLL_ROLE}
    password_env: CDC_MARIADB_PASSWORD
    topic_prefix: {self.prefix}
    poll_interval_s: 0.2
{source_yaml}
kafka:
  bootstrap_servers: {self.profile.kafka_bootstrap}
lake:
  root: lake
tables:
{tables_yaml}
"""
        )
        return self.config

    @property
    def config(self) -> PlatformConfig:
        return load_config(self.config_path)

    def poller(self, **options: Any) -> PollingCapture:
        settings = {"until_caught_up": True, "give_up_after_s": 60, **options}
        poller = open_source(self.config, self.source).capture(CaptureSettings(**settings))
        assert isinstance(poller, PollingCapture)
        return poller

    @property
    def offsets_topic(self) -> str:
        return f"__cdc-offsets.{self.prefix}"

    @contextmanager
    def running_poller(self, before_polling: Callable[[], None] = lambda: None) -> Iterator[PollingCapture]:
        """The poller running in a thread for the block, as a user runs it beside the checks
        (they compare rows only once a poll after their read of the source confirms it).
        ``before_polling`` runs once its start is recorded, before its first poll."""
        poller = self.poller(until_caught_up=False)
        poller.preflight()  # its start is recorded before the block: a check may run at once
        before_polling()
        with running_in_thread(poller):
            yield poller

    def poll(self) -> PollingCapture:
        poller = self.poller()
        poller.run()
        return poller

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{self.database}.{table}"

    def consume(self, tables: Sequence[str]) -> list[Message]:
        return consume_topics(self.profile.kafka_bootstrap, [self.topic(t) for t in tables])


def make_polling_env(profile: StackProfile, tmp_path: Path, ddl: Sequence[str]) -> Iterator[PollingEnv]:
    suffix = uuid.uuid4().hex[:8]
    env = PollingEnv(profile, tmp_path / "cdc_platform.yaml", f"p_{suffix}", f"poll{suffix}")
    admin = LocalMariaDB(profile).admin_connect(stack_env(profile))
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{env.database}` CHARACTER SET utf8mb4")
            for host in ("127.0.0.1", "localhost"):
                cur.execute(f"GRANT SELECT ON `{env.database}`.* TO '{POLL_ROLE}'@'{host}'")
    finally:
        admin.close()
    with env.db() as cur:
        for statement in ddl:
            cur.execute(statement)
    yield env
    admin = LocalMariaDB(profile).admin_connect(stack_env(profile))
    try:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{env.database}`")
    finally:
        admin.close()
    client = AdminClient({"bootstrap.servers": profile.kafka_bootstrap})
    topics = [t for t in client.list_topics(timeout=10).topics if t.startswith(env.prefix + ".")]
    topics.append(env.offsets_topic)
    for future in client.delete_topics(topics, operation_timeout=30).values():
        with contextlib.suppress(KafkaException):  # already gone
            future.result(timeout=30)
