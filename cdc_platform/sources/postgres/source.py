"""A PostgreSQL source behind the ``Source`` interface: logical decoding for the stream,
exported MVCC snapshots for generations, the replication slot as the source offset."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from psycopg import sql

from cdc_platform.config.model import TableConfig
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.chunks import ChunkPlan
from cdc_platform.model.rehydration import signal_tables, slot_lost
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
from cdc_platform.sources.postgres.catalog import count_rows, rows_written
from cdc_platform.sources.postgres.producer import (
    debezium_of,
    heartbeat_every_s,
    lost_slot_advice,
    producer_label,
    refuse_platform_capture,
    start_producer_advice,
    unfed_cause,
)
from cdc_platform.sources.postgres.slot import SlotState, create_slot, current_wal_position, drop_slot, read_slot
from cdc_platform.sources.postgres.snapshot import describe, jdbc_read, snapshot_plan
from cdc_platform.sources.postgres.stream import PostgresCapture, PostgresEndpoint, last_heartbeat

# Tables estimated above this are not count(*)-ed on every observation.
EXACT_COUNT_LIMIT = 5_000_000
WAIT_POLL_S = 1.0
# a capture (or Debezium task) restarting reconnects to its slot within this; a slot without a
# reader for longer is not being read, and will not confirm a position however long one waits
UNREAD_SLOT_GRACE_S = 4.0


HEARTBEATS_MISSED = 3  # silent longer than three heartbeats: not a running capture between two


class PostgresConnector(Source):
    capabilities = Capabilities(
        sees_hard_deletes=True, exact_snapshot_count=True, kind_label="postgres", resumable_snapshots=True
    )

    def __init__(self, endpoint: PostgresEndpoint, kafka: KafkaClients) -> None:
        self.endpoint, self.kafka = endpoint, kafka
        self.name = endpoint.name

    def describe(self, table: TableConfig) -> tuple[SourceTable, TableSchema]:
        with self.endpoint.connect("catalog") as conn:
            return describe(conn, table)

    def observe(self, table: TableConfig) -> Observation:
        with self.endpoint.connect("catalog") as conn:
            described, schema = describe(conn, table)
            exact = described.estimated_rows <= EXACT_COUNT_LIMIT
            rows = count_rows(conn, described.schema, described.name) if exact else described.estimated_rows
            slot = read_slot(conn, self.endpoint.slot)
        return Observation(described, schema, rows, exact, slot_metrics(slot))

    def position(self) -> int:
        with self.endpoint.connect("position") as conn:
            return current_wal_position(conn)

    def format_position(self, position: int) -> str:
        return format_lsn(position)

    def snapshot(
        self, table: TableConfig, kafka: KafkaClients, topic: str, consistent: bool = True,
        resume: ChunkPlan | None = None,
    ) -> AbstractContextManager[SnapshotPlan]:  # fmt: skip
        return snapshot_plan(
            self.endpoint, table, kafka, topic, consistent, resume
        )  # chunks by rows, not a partition count

    def key_read(self, table: TableConfig, key: tuple[str, ...]) -> JdbcRead:
        described, schema = self.describe(table)
        keyed = TableSchema(tuple(c for c in schema.columns if c.name in key), key)
        return jdbc_read(self.endpoint, described, keyed, ["TRUE"], None)

    def capture(self, settings: CaptureSettings) -> PostgresCapture:
        refused = refuse_platform_capture(self.endpoint)
        if refused:
            from cdc_platform.model.errors import FatalError

            raise FatalError(refused, reason="producer_is_debezium")
        return PostgresCapture(self.endpoint, self.kafka, settings)

    def status(self) -> dict[str, object]:
        with self.endpoint.connect("status") as conn:
            slot = read_slot(conn, self.endpoint.slot)
        heartbeat = last_heartbeat(self.kafka, self.endpoint)
        last: dict[str, object] = {
            "last_heartbeat": datetime.fromtimestamp(int(heartbeat["ts_ms"]) / 1000, UTC).isoformat()
            if heartbeat
            else None,
            "lag_seconds_at_last_heartbeat": heartbeat.get("lag_seconds") if heartbeat else None,
            "remembered_slot": heartbeat.get("slot") if heartbeat else None,  # capture confirmed with this slot
        }
        last["producer"] = producer_label(self.endpoint)
        if debezium_of(self.endpoint):  # Debezium's heartbeat records carry only a time
            last["advice_if_stalled"] = start_producer_advice(self.endpoint)
        if slot is None:
            return {"slot": self.endpoint.slot, "exists": False, **last}
        return {
            **last, "slot": slot.name, "exists": True, "confirmed_flush_lsn": format_lsn(slot.confirmed),
            "wal_status": slot.wal_status, "active_pid": slot.active_pid, "lag_bytes": slot.lag_bytes,
            "current_wal_lsn": format_lsn(slot.current_wal),
        }  # fmt: skip

    def capture_silences(self) -> Mapping[str, CaptureSilence]:
        """From the newest heartbeat record, one for every table of the source: the
        platform's capture sends one every ``heartbeat_interval_s`` while it runs, busy or
        quiet; a Debezium connector every ``heartbeat.interval.ms``, when set (without it
        there is nothing to go by)."""
        every_s = heartbeat_every_s(self.endpoint)
        heartbeat = last_heartbeat(self.kafka, self.endpoint) if every_s else None
        if every_s is None or heartbeat is None or "ts_ms" not in heartbeat:
            return {}
        seconds = max(0.0, time.time() - int(heartbeat["ts_ms"]) / 1000)
        silence = CaptureSilence(seconds, HEARTBEATS_MISSED * every_s, start_producer_advice(self.endpoint))
        return dict.fromkeys((t.key for t in self.endpoint.tables), silence)

    def position_lost(self) -> str | None:
        with self.endpoint.connect("status") as conn:
            slot = read_slot(conn, self.endpoint.slot)
        heartbeat = last_heartbeat(self.kafka, self.endpoint) if slot is None else None
        remembered = str(heartbeat.get("slot")) if heartbeat else None
        return slot_lost(self.endpoint.slot, slot is not None, slot.wal_status if slot else None, remembered)

    def prepare_generation(self, reason: str) -> str | None:
        """Before a generation that replaces a lost source position: a fresh slot, so every
        change after the generation's watermark is kept for capture (restart capture after)."""
        if reason != "source_position_lost":
            return None
        with self.endpoint.connect("snapshot") as conn:
            slot = read_slot(conn, self.endpoint.slot)
            if slot is not None and slot.wal_status != "lost":
                return f"replication slot {slot.name} exists"
            if debezium_of(self.endpoint):
                from cdc_platform.model.errors import RetriableError

                raise RetriableError(lost_slot_advice(self.endpoint), reason="source_position_lost")
            if slot is not None:
                if slot.active_pid is not None:
                    from cdc_platform.model.errors import FatalError

                    raise FatalError(f"replication slot {slot.name} is lost but still in use by pid {slot.active_pid}")
                drop_slot(conn, slot.name)
            created = create_slot(conn, self.endpoint.slot)
        return (
            f"created replication slot {self.endpoint.slot} at {format_lsn(created)}; restart capture to stream from it"
        )

    def signals(self) -> Iterator[Signal]:
        signal_table = self.endpoint.config.signal_table
        if not signal_table:
            return
        schema_name, table_name = signal_table.split(".", 1)
        local = {f"{t.schema_name}.{t.table_name}": t.key for t in self.endpoint.tables}
        query = sql.SQL("SELECT id::text, type, data FROM {}.{}").format(
            sql.Identifier(schema_name), sql.Identifier(table_name)
        )
        with self.endpoint.connect("signals") as conn, conn.transaction(), conn.cursor(name="cdc_signals") as cur:
            cur.itersize = 1000  # a server-side cursor: signal tables are seldom pruned
            for signal_id, kind, data in cur.execute(query):
                tables = signal_tables(str(kind), None if data is None else str(data), self.name, local)
                if tables:
                    yield Signal(f"signal:{self.name}:{signal_id}", tuple(tables))

    def rows_written(self, table: TableConfig) -> int | None:
        with self.endpoint.connect("catalog") as conn:
            return rows_written(conn, table.schema_name, table.table_name)

    def unfed_cause(self, table: TableConfig) -> str:
        return unfed_cause(self.endpoint, f"{table.schema_name}.{table.table_name}")

    def wait_until_captured(self, position: int, deadline: float, stop_when_unread: bool = False) -> str:
        """Up to ``deadline``; with ``stop_when_unread`` also until the slot has had no reader
        for ``UNREAD_SLOT_GRACE_S``: a slot nobody reads confirms nothing, however long one waits."""
        unread_since: float | None = None
        with self.endpoint.connect("verify") as conn:
            while True:
                slot = read_slot(conn, self.endpoint.slot)
                confirmed = slot.confirmed if slot else 0
                if confirmed >= position:
                    return ""
                now = time.monotonic()
                if slot is not None and slot.active_pid is not None:
                    unread_since = None
                elif unread_since is None:
                    unread_since = now
                unread = stop_when_unread and unread_since is not None and now - unread_since >= UNREAD_SLOT_GRACE_S
                if unread or now > deadline:
                    reader = "read by no process" if unread else "being read"
                    return (
                        f"capture has not confirmed {format_lsn(position)} (slot {self.endpoint.slot} at "
                        f"{format_lsn(confirmed)}, {reader}); {start_producer_advice(self.endpoint)}"
                    )
                time.sleep(WAIT_POLL_S)


def slot_metrics(slot: SlotState | None) -> dict[str, MetricValue]:
    """Capture's position for the table's source: WAL retained behind the slot is plotted."""
    if slot is None:
        return {"capture_slot": "missing (capture has not run, or the slot was lost)"}
    return {
        "capture_confirmed_lsn": format_lsn(slot.confirmed),
        "capture_lag_bytes": slot.lag_bytes,
        "capture_slot_active": slot.active_pid is not None,
        "capture_wal_status": slot.wal_status,
    }
