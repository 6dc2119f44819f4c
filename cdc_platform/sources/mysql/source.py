"""A polled MariaDB/MySQL source behind the ``Source`` interface: polling queries for the
stream, a parallel JDBC read for generations, the database clock as the position."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict
from datetime import UTC, datetime

from cdc_platform.config.model import TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.chunks import ChunkPlan
from cdc_platform.model.tables import SourceTable, TableSchema
from cdc_platform.sources.base import (
    Capabilities,
    CaptureSettings,
    CaptureSilence,
    JdbcRead,
    MetricValue,
    Observation,
    Signal,
    SnapshotPlan,
    Source,
)
from cdc_platform.sources.mysql.catalog import describe_mysql_table, polled_key, quote_mysql, table_schema
from cdc_platform.sources.mysql.connection import MysqlEndpoint, database_clock_ns
from cdc_platform.sources.mysql.cursors import TableCursor, read_stored_cursors
from cdc_platform.sources.mysql.poller import CAUGHT_UP_EVERY_NS, PollingCapture
from cdc_platform.sources.mysql.snapshot import jdbc_read, snapshot_plan

EXACT_COUNT_LIMIT = 5_000_000
WAIT_POLL_S = 1.0


class MysqlConnector(Source):
    def __init__(self, endpoint: MysqlEndpoint, kafka: KafkaClients) -> None:
        self.endpoint, self.kafka = endpoint, kafka
        self.name = endpoint.name
        self.capabilities = Capabilities(
            sees_hard_deletes=False,
            exact_snapshot_count=False,
            kind_label=endpoint.config.dialect,
            resumable_snapshots=True,
        )

    def describe(self, table: TableConfig) -> tuple[SourceTable, TableSchema]:
        conn = self.endpoint.connect("catalog")
        try:
            described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        finally:
            conn.close()
        key = polled_key(described, mapped, table.primary_key, f"tables[{table.key}].primary_key")
        return described, table_schema(described, key)

    def observe(self, table: TableConfig) -> Observation:
        described, schema = self.describe(table)
        exact = described.estimated_rows <= EXACT_COUNT_LIMIT
        rows = self._count(table) if exact else described.estimated_rows
        cursor = self.stored_cursors().get(table.key)
        return Observation(described, schema, rows, exact, cursor_metrics(cursor))

    def _count(self, table: TableConfig) -> int:
        conn = self.endpoint.connect("catalog")
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM {quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}")
                counted = cur.fetchone()
        finally:
            conn.close()
        return int(counted[0]) if counted else 0

    def stored_cursors(self) -> dict[str, TableCursor]:
        return read_stored_cursors(self.kafka, self.endpoint.offsets_topic, self.name)

    def position(self) -> int:
        conn = self.endpoint.connect("position")
        try:
            return database_clock_ns(conn)
        finally:
            conn.close()

    def format_position(self, position: int) -> str:
        """A polled source's position is its database clock (ns): shown as a time."""
        return f"{datetime.fromtimestamp(position / 1e9, UTC).isoformat()} (poll position {position})"

    def snapshot(
        self, table: TableConfig, kafka: KafkaClients, topic: str, consistent: bool = True,
        resume: ChunkPlan | None = None,
    ) -> AbstractContextManager[SnapshotPlan]:  # fmt: skip
        return snapshot_plan(self.endpoint, table, kafka, topic, resume)  # chunks by rows, not a partition count

    def key_read(self, table: TableConfig, key: tuple[str, ...]) -> JdbcRead:
        conn = self.endpoint.connect("catalog")
        try:
            _, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        finally:
            conn.close()
        by_name = {m.name: m for m in mapped}
        return jdbc_read(self.endpoint, table, [by_name[k] for k in key], mapped, ["1 = 1"])

    def capture(self, settings: CaptureSettings) -> PollingCapture:
        return PollingCapture(self.endpoint, self.kafka, settings)

    def status(self) -> dict[str, object]:
        cursors = {table: asdict(cursor) for table, cursor in self.stored_cursors().items()}
        return {"source": self.name, "kind": "jdbc", "cursors": cursors}

    def capture_silences(self) -> Mapping[str, CaptureSilence]:
        """From the tables' stored cursors: a running poller records reading a table to the
        end at least every ``CAUGHT_UP_EVERY_NS`` (database time), so it is silent no longer
        than that plus three polls (``wait_until_captured``'s rule). A poller that cannot
        keep up with a table never reads it to the end, and shows as silent too: it is
        behind the source by that long."""
        cursors = self.stored_cursors()
        alive = {t.key: cursors[t.key].alive_at() for t in self.endpoint.tables if t.key in cursors}
        alive = {key: at for key, at in alive.items() if at}
        if not alive:
            return {}
        now, silent_s = self.position(), self._silent_ns() / 1e9
        advice = f"is the poller running? start it: cdc-platform capture run --source {self.name}"
        return {key: CaptureSilence(max(0.0, (now - at) / 1e9), silent_s, advice) for key, at in alive.items()}

    def position_lost(self) -> str | None:
        return None  # polling has no log position to lose: its cursor is in Kafka

    def signals(self) -> Iterator[Signal]:
        return iter(())

    def confirms_within_s(self) -> float:
        """A running poller records reading a quiet table to the end once every
        ``CAUGHT_UP_EVERY_NS``, so it confirms a position that long after it, three polls over."""
        return self._silent_ns() / 1e9

    def _silent_ns(self) -> int:
        """The longest a running poller records no read to the end of a table: a quiet
        table's record every ``CAUGHT_UP_EVERY_NS``, three polls over."""
        return CAUGHT_UP_EVERY_NS + 3 * int(self.endpoint.config.poll_interval_s * 1_000_000_000)

    def wait_until_captured(self, position: int, deadline: float, stop_when_unread: bool = False) -> str:
        """A poll that began after ``position`` read the table to the end. With
        ``stop_when_unread``, no use waiting when nothing polls: a poller that exited marks
        its cursors stopped, and a running one records reading to the end at least every
        ``CAUGHT_UP_EVERY_NS`` (a quiet table) plus a poll interval from the time it
        started, so no such record in that span, three polls over, before ``position``
        means one that died."""
        silent_ns = self._silent_ns()
        start = f"start it: cdc-platform capture run --source {self.name}"
        while True:
            cursors = self.stored_cursors()
            tables = [t.key for t in self.endpoint.tables]
            if all(key in cursors and cursors[key].caught_up_at >= position for key in tables):
                return ""
            if stop_when_unread and cursors and all(c.stopped for c in cursors.values()):
                return f"the poller stopped (its cursors say so) before it read the table to the end; {start}"
            newest = max((c.alive_at() for c in cursors.values()), default=0)
            if stop_when_unread and position - newest > silent_ns:
                since = f"for {(position - newest) // 10**9} s" if newest else "yet"
                return f"the poller has not read a table to the end {since}; {start}"
            if time.monotonic() > deadline:
                return f"the poller has not read the table to the end since the source was read; is it running? {start}"
            time.sleep(WAIT_POLL_S)


def cursor_metrics(cursor: TableCursor | None) -> dict[str, MetricValue]:
    if cursor is None:
        return {"poll_cursor": "none stored (the poller has not run yet)"}
    metrics: dict[str, MetricValue] = {
        "poll_cursor": cursor.describe(),
        "poll_rows_published": cursor.rows,
        "poll_position": cursor.position,
    }
    if cursor.committed_at:
        age = (datetime.now(UTC) - datetime.fromisoformat(cursor.committed_at)).total_seconds()
        metrics["poll_cursor_age_s"] = round(age, 3)
    return metrics
