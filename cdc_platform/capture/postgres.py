"""PostgreSQL capture: logical decoding (pgoutput) into Kafka, at least once.

The slot's confirmed position (what PostgreSQL may discard WAL up to) advances only to
the end of a transaction all of whose events — and all earlier transactions' events —
Kafka has acknowledged. A crash at any instant therefore loses nothing: the restarted
capture receives every transaction after the confirmed position again (duplicates are
possible and arrive in source order; the lake ignores them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from psycopg import sql

from cdc_platform.capture.errors import (
    Backoff,
    CaptureError,
    FatalCaptureError,
    RetriableCaptureError,
    SlotLostError,
    classify_postgres_error,
)
from cdc_platform.capture.pg_catalog import SourceTableError, describe_table, resolve_key, resolve_pg_types
from cdc_platform.capture.topics import ensure_topics, producer_config
from cdc_platform.config import PlatformConfig, PostgresSource, TableConfig
from cdc_platform.envelope import pgoutput
from cdc_platform.envelope.debezium import ColumnSpec, EnvelopeCodec, Record, SourcePosition, TableShape
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.envelope.pgtypes import ConversionOptions, PgType

log = logging.getLogger("cdc_platform.capture")

# The replication session's settings make pgoutput's text values unambiguous.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=iso_8601 -c extra_float_digits=1 -c bytea_output=hex"
)


@dataclass
class _Transaction:
    commit_lsn: int
    xid: int
    commit_time: datetime
    outstanding: int = 0
    end_lsn: int | None = None  # set at COMMIT
    failed: KafkaError | None = None


class AckTracker:
    """Which source position is safe to confirm: the end of the newest transaction that,
    with every transaction before it, Kafka has fully acknowledged."""

    def __init__(self, confirmed: int) -> None:
        self.confirmed = confirmed
        self._queue: deque[_Transaction] = deque()

    def begin(self, commit_lsn: int, xid: int, commit_time: datetime) -> _Transaction:
        txn = _Transaction(commit_lsn, xid, commit_time)
        self._queue.append(txn)
        return txn

    def sent(self, txn: _Transaction) -> None:
        txn.outstanding += 1

    def acked(self, txn: _Transaction, error: KafkaError | None) -> None:
        txn.outstanding -= 1
        if error and txn.failed is None:
            txn.failed = error

    def commit(self, txn: _Transaction, end_lsn: int) -> None:
        txn.end_lsn = end_lsn

    def advance(self) -> int:
        """Move ``confirmed`` past fully acknowledged transactions; raise on a failed one."""
        while self._queue:
            head = self._queue[0]
            if head.failed is not None:
                raise delivery_error(head.failed, head.xid, self.confirmed)
            if head.end_lsn is None or head.outstanding > 0:
                break
            self._queue.popleft()
            self.confirmed = max(self.confirmed, head.end_lsn)
        return self.confirmed

    @property
    def idle(self) -> bool:
        return not self._queue

    def idle_advance(self, server_position: int) -> int:
        """Heartbeat: with nothing open or in flight, everything the server has decoded up
        to ``server_position`` is either delivered or irrelevant to our publication."""
        if self.idle and server_position > self.confirmed:
            self.confirmed = server_position
        return self.confirmed


# Broker answers that no retry can change: stop and say what to fix.
_PERMANENT_KAFKA_ERRORS = {
    KafkaError.INVALID_RECORD: "the broker rejected the record (a compacted topic needs keys)",
    KafkaError.MSG_SIZE_TOO_LARGE: "an event is larger than the topic allows; raise the topic's "
    "max.message.bytes and the producer's message.max.bytes (kafka.options)",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "not authorized to write the topic; grant WRITE on it",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "not authorized for idempotent writes; grant IDEMPOTENT_WRITE",
    KafkaError.POLICY_VIOLATION: "a broker policy rejected the record",
}


def delivery_error(error: KafkaError, xid: int, confirmed: int) -> CaptureError:
    where = f"an event of transaction {xid} was not acknowledged ({error.str()})"
    hint = _PERMANENT_KAFKA_ERRORS.get(error.code())
    if hint is not None or error.fatal():
        return FatalCaptureError(
            f"{where}: {hint or 'fatal producer error'}; nothing after {format_lsn(confirmed)} "
            "was confirmed, so restarting after the fix loses nothing"
        )
    return RetriableCaptureError(f"{where}; resuming from the confirmed position {format_lsn(confirmed)}")


@dataclass
class CaptureStats:
    transactions: int = 0
    events: Counter[str] = field(default_factory=Counter)  # by op, plus "tombstone"
    confirmed_lsn: int = 0
    last_commit_time: datetime | None = None
    reconnects: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "events": dict(self.events),
            "confirmed_lsn": format_lsn(self.confirmed_lsn),
            "last_commit_time": self.last_commit_time.isoformat() if self.last_commit_time else None,
            "reconnects": self.reconnects,
        }


@dataclass(frozen=True)
class CaptureOptions:
    until_caught_up: bool = False
    max_reconnect_wait_s: float = 30.0
    give_up_after_s: float | None = None  # None: retry forever (a long-running worker)
    status_interval_s: float = 10.0
    status_file: Path | None = None
    # Create a new slot even though an earlier one of this source was lost: the caller
    # accepts the gap (the tables get rehydrated by a new snapshot generation).
    new_slot: bool = False


class PostgresCapture:
    """One source database's capture: publication + slot + Kafka topics + the stream."""

    def __init__(self, config: PlatformConfig, source_name: str, options: CaptureOptions | None = None) -> None:
        if source_name not in config.sources:
            raise FatalCaptureError(
                f"no source '{source_name}' in the config (sources: {', '.join(sorted(config.sources))})"
            )
        self.config = config
        self.source_name = source_name
        self.source: PostgresSource = config.postgres(source_name)
        self.tables: list[TableConfig] = [t for t in config.tables if t.source == source_name]
        if not self.tables:
            raise FatalCaptureError(f"source '{source_name}' has no tables in the config; add some under tables:")
        self.slot = config.slot_for(source_name)
        self.publication = config.publication_for(source_name)
        self.options = options or CaptureOptions()
        self.codec = EnvelopeCodec(
            server_name=self.source.topic_prefix or source_name,
            database=self.source.database,
            with_schema=self.source.envelope_schemas,
            options=ConversionOptions(self.source.decimal_handling, self.source.interval_handling),
        )
        self.heartbeat_topic = f"__debezium-heartbeat.{self.source.topic_prefix or source_name}"
        self.stats = CaptureStats()
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}
        self._topics = {(t.schema_name, t.table_name): config.topic_for(t) for t in self.tables}
        self._types: dict[int, PgType] = {}
        self._slot_created_at: int | None = None
        self._stop = False

    # -- connections ----------------------------------------------------------------------
    def _conninfo(self) -> str:
        return self.source.conninfo(self.source_name, f"cdc_platform_capture_{self.source_name}")

    def _sql_connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(self._conninfo(), autocommit=True)
        except psycopg.OperationalError as exc:
            raise classify_postgres_error(exc, source=self.source_name, user=self.source.user, slot=self.slot) from None

    def _replication_connect(self) -> Any:
        try:
            return psycopg2.connect(
                self._conninfo(),
                options=SESSION_OPTIONS,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
            )
        except psycopg2.OperationalError as exc:
            raise classify_postgres_error(exc, source=self.source_name, user=self.source.user, slot=self.slot) from None

    def _producer_config(self) -> dict[str, Any]:
        return producer_config(self.config.kafka)

    # -- preflight: everything that is fatal if wrong -----------------------------------------
    def preflight(self) -> int:
        """Check tables, keys, publication, slot and topics. Returns the slot's confirmed LSN."""
        with self._sql_connect() as conn:
            for table in self.tables:
                try:
                    described = describe_table(conn, table.schema_name, table.table_name)
                    key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
                except SourceTableError as exc:
                    raise FatalCaptureError(str(exc)) from None
                if described.replica_identity == "nothing":
                    raise FatalCaptureError(
                        f"{described.qualified} has REPLICA IDENTITY NOTHING: updates and deletes cannot be "
                        f"captured; run ALTER TABLE {described.sql_name} REPLICA IDENTITY DEFAULT (or FULL)"
                    )
                if described.replica_identity != "full":
                    log.warning(
                        "%s has REPLICA IDENTITY %s: 'before' of updates is null and 'before' of deletes holds "
                        "only the key columns; for whole old rows run ALTER TABLE %s REPLICA IDENTITY FULL",
                        described.qualified,
                        described.replica_identity.upper(),
                        described.sql_name,
                    )
                self._keys[(table.schema_name, table.table_name)] = key
            self._ensure_publication(conn)
            confirmed = self._ensure_slot(conn)
        self._ensure_topics()
        if self._slot_created_at is not None:
            # remember the slot durably (the heartbeat topic is compacted, keyed by source):
            # if it disappears later, the next start knows changes were lost
            producer = Producer(self._producer_config())
            self._heartbeat(producer, confirmed)
            if producer.flush(30) != 0:
                raise RetriableCaptureError("could not record the new slot in the heartbeat topic")
        return confirmed

    def last_heartbeat(self) -> dict[str, Any] | None:
        """The newest heartbeat record of this source, or None if there is none."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                **self.config.kafka.client_config(),
                "group.id": f"cdc_platform_heartbeat_reader_{self.source_name}",
                "enable.auto.commit": False,
            }
        )
        try:
            metadata = consumer.list_topics(self.heartbeat_topic, timeout=15)
            topic = metadata.topics.get(self.heartbeat_topic)
            if topic is None or topic.error is not None:
                return None
            low, high = consumer.get_watermark_offsets(TopicPartition(self.heartbeat_topic, 0), timeout=15)
            if high <= low:
                return None
            consumer.assign([TopicPartition(self.heartbeat_topic, 0, high - 1)])
            msg = consumer.poll(15)
            if msg is None or msg.error() or msg.value() is None:
                return None
            value = json.loads(msg.value() or b"{}")
            return value if isinstance(value, dict) else None
        except KafkaException as exc:
            raise RetriableCaptureError(f"Kafka unreachable at {self.config.kafka.bootstrap_servers}: {exc}") from None
        finally:
            consumer.close()

    def _table_idents(self) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("{}.{}").format(sql.Identifier(t.schema_name), sql.Identifier(t.table_name)) for t in self.tables
        )

    def _ensure_publication(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)).fetchone()
        if exists:
            published = {
                (str(r[0]), str(r[1]))
                for r in conn.execute(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (self.publication,)
                )
            }
            missing = [t for t in self.tables if (t.schema_name, t.table_name) not in published]
            if not missing:
                return
            statement = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(self.publication),
                sql.SQL(", ").join(
                    sql.SQL("{}.{}").format(sql.Identifier(t.schema_name), sql.Identifier(t.table_name))
                    for t in missing
                ),
            )
        else:
            statement = sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(self.publication), self._table_idents()
            )
        try:
            conn.execute(statement)
            log.info("publication %s: %s", self.publication, statement.as_string(conn))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise FatalCaptureError(
                f"source '{self.source_name}': role {self.source.user} may not create or change publication "
                f"{self.publication} ({' '.join(str(exc).split())}); as the tables' owner run: "
                f"{statement.as_string(conn)}"
            ) from None

    def _ensure_slot(self, conn: psycopg.Connection[tuple[Any, ...]]) -> int:
        row = conn.execute(
            """SELECT wal_status, confirmed_flush_lsn::text, active_pid, plugin
               FROM pg_replication_slots WHERE slot_name = %s""",
            (self.slot,),
        ).fetchone()
        if row is None:
            previous = self.last_heartbeat()
            if previous is not None and previous.get("slot") == self.slot and not self.options.new_slot:
                raise SlotLostError(
                    f"source '{self.source_name}': replication slot {self.slot} no longer exists, but capture "
                    f"confirmed changes up to {format_lsn(int(previous.get('lsn', 0)))} with it: the changes "
                    "since are gone. The captured tables must be rehydrated (new snapshot generation); then "
                    "run capture with --new-slot to start a new slot."
                )
            try:
                created = conn.execute(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,)
                ).fetchone()
            except psycopg.Error as exc:
                raise classify_postgres_error(
                    exc, source=self.source_name, user=self.source.user, slot=self.slot
                ) from None
            assert created is not None
            log.info("created replication slot %s at %s", self.slot, created[0])
            from cdc_platform.envelope.lsn import parse_lsn

            self._slot_created_at = parse_lsn(str(created[0]))
            return self._slot_created_at
        wal_status, confirmed, active_pid, plugin = row
        if wal_status == "lost":
            raise SlotLostError(
                f"source '{self.source_name}': replication slot {self.slot} is invalidated (wal_status=lost): "
                "PostgreSQL removed WAL it still needed. The captured tables must be rehydrated (new snapshot "
                f"generation); drop the slot (SELECT pg_drop_replication_slot('{self.slot}')) and restart capture."
            )
        if plugin != "pgoutput":
            raise FatalCaptureError(
                f"replication slot {self.slot} uses plugin {plugin}, not pgoutput; drop it or set slot_name"
            )
        if active_pid is not None:
            raise FatalCaptureError(
                f"source '{self.source_name}': replication slot {self.slot} is in use by backend pid {active_pid}; "
                "run only one capture per source"
            )
        from cdc_platform.envelope.lsn import parse_lsn

        return parse_lsn(str(confirmed))

    def _ensure_topics(self) -> None:
        # the heartbeat topic is compacted: it keeps the latest heartbeat per source
        ensure_topics(self.config.kafka, list(self._topics.values()), [self.heartbeat_topic])

    # -- types ------------------------------------------------------------------------------
    def _resolve_types(self, oids: Iterable[int]) -> None:
        if all(o in self._types for o in oids):
            return
        with self._sql_connect() as conn:
            resolve_pg_types(conn, oids, self._types)

    def _shape(self, relation: pgoutput.Relation) -> TableShape | None:
        ident = (relation.namespace, relation.name)
        if ident not in self._topics:
            # a shared publication may hold more tables than this config captures
            log.warning(
                "publication %s publishes %s.%s, which is not in the config: its changes are skipped",
                self.publication,
                relation.namespace,
                relation.name,
            )
            return None
        self._resolve_types([c.type_oid for c in relation.columns])
        key = self._keys[ident]
        columns = tuple(
            ColumnSpec(c.name, self._types[c.type_oid], c.type_modifier, nullable=c.name not in key)
            for c in relation.columns
        )
        missing = [k for k in key if k not in {c.name for c in columns}]
        if missing:
            raise FatalCaptureError(f"{relation.namespace}.{relation.name}: key column(s) {missing} were dropped")
        return TableShape(
            schema=relation.namespace,
            table=relation.name,
            columns=columns,
            key_columns=key,
            full_identity=relation.replica_identity == "f",
            topic=self._topics[ident],
        )

    # -- the stream ---------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop = True

    def run(self) -> CaptureStats:
        """Stream until stopped (or, with ``until_caught_up``, until every change committed
        before the start is in Kafka). Retriable errors reconnect with backoff."""
        confirmed = self.preflight()
        self.stats.confirmed_lsn = confirmed
        target = self._current_wal_lsn() if self.options.until_caught_up else None
        backoff = Backoff(self.options.max_reconnect_wait_s, self.options.give_up_after_s)
        while True:
            try:
                if self._stream(target):
                    return self.stats
                if self._stop:
                    return self.stats
                backoff.reset()
            except (psycopg2.Error, psycopg.Error, RetriableCaptureError) as exc:
                error = (
                    exc
                    if isinstance(exc, RetriableCaptureError)
                    else classify_postgres_error(exc, source=self.source_name, user=self.source.user, slot=self.slot)
                )
                if not error.retriable:
                    raise error from None
                self.stats.reconnects += 1
                backoff.failed(error)

    def _current_wal_lsn(self) -> int:
        from cdc_platform.envelope.lsn import parse_lsn

        with self._sql_connect() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return parse_lsn(str(row[0]))

    def _stream(self, target: int | None) -> bool:
        """One replication session. Returns True when caught up (bounded mode)."""
        producer = Producer(self._producer_config())
        repl = self._replication_connect()
        try:
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.slot,
                decode=False,
                options={"proto_version": "1", "publication_names": self.publication},
                status_interval=10,
            )
            return self._consume(cur, producer, target)
        finally:
            # deliver what is in flight (their acks no longer move the slot: a new session
            # resumes from the confirmed position, so anything unconfirmed is re-sent)
            producer.flush(10)
            with contextlib.suppress(psycopg2.Error):
                repl.close()

    def _consume(self, cur: Any, producer: Producer, target: int | None) -> bool:
        tracker = AckTracker(self.stats.confirmed_lsn)
        relations: dict[int, TableShape | None] = {}
        txn: _Transaction | None = None
        last_feedback = last_status = last_heartbeat = time.monotonic()
        reported = tracker.confirmed
        partitions = self.config.kafka.partitions

        def deliver(txn_: _Transaction) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, _msg: Message) -> None:
                tracker.acked(txn_, err)

            return callback

        def produce(record: Record, owner: _Transaction) -> None:
            tracker.sent(owner)
            while True:
                try:
                    producer.produce(
                        record.topic,
                        key=record.key,
                        value=record.value,
                        on_delivery=deliver(owner),
                        partition=-1 if record.partition is None else record.partition,  # -1: the partitioner
                    )
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            self.stats.events[record.op or "tombstone"] += 1

        while not self._stop:
            msg = cur.read_message()
            now = time.monotonic()
            if msg is None:
                producer.poll(0)
                confirmed = tracker.advance()
                if txn is None and len(producer) == 0 and cur.wal_end:
                    confirmed = tracker.idle_advance(int(cur.wal_end))
                caught_up = target is not None and txn is None and tracker.idle and confirmed >= target
                if confirmed != reported or now - last_feedback >= 1.0 or caught_up:
                    # ask for a keepalive while catching up, so idle positions arrive promptly
                    cur.send_feedback(write_lsn=confirmed, flush_lsn=confirmed, reply=target is not None, force=True)
                    reported, last_feedback = confirmed, now
                self.stats.confirmed_lsn = confirmed
                if now - last_heartbeat >= self.source.heartbeat_interval_s:
                    self._heartbeat(producer, confirmed, self._lag_seconds(tracker.idle and txn is None))
                    last_heartbeat = now
                if now - last_status >= self.options.status_interval_s:
                    self._report(confirmed)
                    last_status = now
                if caught_up:
                    self._report(confirmed)
                    return True
                select.select([cur.connection], [], [], 0.2)
                continue

            message = pgoutput.decode(msg.payload)
            if isinstance(message, pgoutput.Begin):
                txn = tracker.begin(message.final_lsn, message.xid, message.commit_time)
            elif isinstance(message, pgoutput.Commit):
                if txn is not None:
                    tracker.commit(txn, message.end_lsn)
                    self.stats.transactions += 1
                    self.stats.last_commit_time = message.commit_time
                txn = None
                producer.poll(0)
            elif isinstance(message, pgoutput.Relation):
                relations[message.relation_id] = self._shape(message)
            elif isinstance(message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete | pgoutput.Truncate):
                if txn is None:
                    raise RetriableCaptureError("change outside a transaction; resynchronising")
                position = SourcePosition(txn.commit_lsn, int(msg.data_start), txn.xid, txn.commit_time)
                now_us = time.time_ns() // 1000
                for record in self._records(message, relations, position, now_us, partitions):
                    produce(record, txn)
            # Origin and Type messages need no action (types are resolved from the catalog)

        producer.flush(30)
        confirmed = tracker.advance()
        cur.send_feedback(write_lsn=confirmed, flush_lsn=confirmed, force=True)
        self.stats.confirmed_lsn = confirmed
        self._report(confirmed)
        return False

    def _records(
        self,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete | pgoutput.Truncate,
        relations: dict[int, TableShape | None],
        position: SourcePosition,
        now_us: int,
        partitions: int,
    ) -> list[Record]:
        codec = self.codec
        if isinstance(message, pgoutput.Truncate):
            out: list[Record] = []
            for relation_id in message.relation_ids:
                truncated = relations.get(relation_id)
                if truncated is not None:
                    out += codec.truncate_records(truncated, position, now_us, partitions)
            return out
        shape = relations.get(message.relation_id)
        if shape is None:
            return []
        if isinstance(message, pgoutput.Insert):
            return codec.change_records(shape, "c", message.new, None, False, position, now_us)
        if isinstance(message, pgoutput.Update):
            return codec.change_records(shape, "u", message.new, message.old, message.old_kind == "O", position, now_us)
        return codec.change_records(shape, "d", None, message.old, message.old_kind == "O", position, now_us)

    def _heartbeat(self, producer: Producer, confirmed: int, lag_s: float = 0.0) -> None:
        """Debezium-style heartbeat record: consumers of quiet topics still see time pass,
        and ``capture status`` reads position and lag from the latest one."""
        key = json.dumps({"serverName": self.codec.server_name}, separators=(",", ":")).encode()
        heartbeat = {
            "ts_ms": int(time.time() * 1000),
            "lsn": confirmed,
            "slot": self.slot,
            "lag_seconds": round(lag_s, 3),
        }
        value = json.dumps(heartbeat, separators=(",", ":")).encode()
        with contextlib.suppress(BufferError):  # a full queue: skip this heartbeat
            producer.produce(self.heartbeat_topic, key=key, value=value)

    def _lag_seconds(self, idle: bool) -> float:
        """0 when every received change is acknowledged, else the age of the newest
        commit received (how far behind the source Kafka is, at least)."""
        if idle or self.stats.last_commit_time is None:
            return 0.0
        return max(0.0, (datetime.now(UTC) - self.stats.last_commit_time).total_seconds())

    def _report(self, confirmed: int) -> None:
        lag_s = 0.0
        if self.stats.last_commit_time is not None:
            lag_s = max(0.0, (datetime.now(UTC) - self.stats.last_commit_time).total_seconds())
        log.info(
            "capture %s: confirmed %s, %d transactions, events %s, last commit lag %.1f s",
            self.source_name,
            format_lsn(confirmed),
            self.stats.transactions,
            dict(self.stats.events),
            lag_s,
        )
        if self.options.status_file is not None:
            self.options.status_file.parent.mkdir(parents=True, exist_ok=True)
            status = {**self.stats.as_dict(), "lag_seconds": lag_s, "updated_at": datetime.now(UTC).isoformat()}
            tmp = self.options.status_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(status, indent=2))
            tmp.replace(self.options.status_file)


def slot_status(config: PlatformConfig, source_name: str) -> dict[str, Any]:
    """The slot as PostgreSQL sees it: position, WAL retained behind it (lag bytes), state."""
    capture = PostgresCapture(config, source_name)
    slot = capture.slot
    with capture._sql_connect() as conn:
        row = conn.execute(
            """SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, active_pid,
                      pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
                      pg_current_wal_lsn()::text
               FROM pg_replication_slots WHERE slot_name = %s""",
            (slot,),
        ).fetchone()
    heartbeat = capture.last_heartbeat()
    last = {
        "last_heartbeat": (
            datetime.fromtimestamp(int(heartbeat["ts_ms"]) / 1000, UTC).isoformat() if heartbeat else None
        ),
        "lag_seconds_at_last_heartbeat": heartbeat.get("lag_seconds") if heartbeat else None,
        "remembered_slot": heartbeat.get("slot") if heartbeat else None,  # capture confirmed with this slot
    }
    if row is None:
        return {"slot": slot, "exists": False, **last}
    confirmed, restart, wal_status, active_pid, lag_bytes, current = row
    return {
        **last,
        "slot": slot,
        "exists": True,
        "confirmed_flush_lsn": confirmed,
        "restart_lsn": restart,
        "wal_status": wal_status,
        "active_pid": active_pid,
        "lag_bytes": int(lag_bytes or 0),
        "current_wal_lsn": current,
    }


def prepare_new_slot(config: PlatformConfig, source_name: str) -> str:
    """Before a generation that replaces a lost source position: a fresh slot, so every
    change after the generation's watermark is kept for capture (restart capture after)."""
    capture = PostgresCapture(config, source_name)
    with capture._sql_connect() as conn:
        row = conn.execute(
            "SELECT wal_status, active_pid FROM pg_replication_slots WHERE slot_name = %s", (capture.slot,)
        ).fetchone()
        if row is not None and row[0] != "lost":
            return f"replication slot {capture.slot} exists"
        if row is not None:
            if row[1] is not None:
                raise FatalCaptureError(f"replication slot {capture.slot} is lost but still in use by pid {row[1]}")
            conn.execute("SELECT pg_drop_replication_slot(%s)", (capture.slot,))
        created = conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (capture.slot,)
        ).fetchone()
    assert created is not None
    return f"created replication slot {capture.slot} at {created[0]}; restart capture to stream from it"
