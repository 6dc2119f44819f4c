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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
import psycopg2
import psycopg2.extras
from confluent_kafka import KafkaError, Message, Producer
from psycopg import sql

from cdc_platform.config.model import PostgresSource, TableConfig
from cdc_platform.envelope import pgoutput
from cdc_platform.envelope.debezium import ColumnSpec, EnvelopeCodec, Record, SourcePosition, TableShape
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.envelope.pgtypes import ConversionError, ConversionOptions, PgType
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import CdcError, FatalError, RetriableError, SlotLostError, SourceTableError
from cdc_platform.sources.backoff import Backoff
from cdc_platform.sources.base import CaptureSettings
from cdc_platform.sources.postgres.catalog import describe_table, keyed_schema, resolve_pg_types
from cdc_platform.sources.postgres.errors import classify_postgres_error
from cdc_platform.sources.postgres.slot import SlotState, create_slot, current_wal_position, read_slot

log = logging.getLogger("cdc_platform.capture")

# The replication session's settings make pgoutput's text values unambiguous.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=iso_8601 -c extra_float_digits=1 -c bytea_output=hex "
    "-c lc_monetary=C"  # money's text follows lc_monetary ('1.234,56 €' under de_DE)
)
FEEDBACK_EVERY_S = 1.0
# Messages waiting in the producer with no delivery report for this long: the session ends
# and the next one starts with a new producer (see DeliveryWatch)
DELIVERY_STALL_S = 30.0


@dataclass
class _Transaction:
    commit_lsn: int
    xid: int
    commit_time: datetime
    outstanding: int = 0
    end_lsn: int | None = None  # set at COMMIT
    failed: KafkaError | None = None


class DeliveryWatch:
    """Whether Kafka still takes a session's messages. After a broker restart, librdkafka
    can keep a partition's messages waiting on a leader it does not look up again (seen in
    the fault suite: no delivery for two minutes, until ``message.timeout.ms``; compare
    confluentinc/librdkafka#4976). A new producer looks every leader up afresh, so a
    session whose messages wait ``stall_s`` without any delivery report is ended."""

    def __init__(self, stall_s: float, now: float) -> None:
        self.stall_s = stall_s
        self.deliveries = 0
        self._seen, self._since = 0, now

    def delivered(self) -> None:
        """A delivery report, success or failure: Kafka answers."""
        self.deliveries += 1

    def stalled(self, waiting: int, now: float) -> bool:
        """``waiting``: the messages in the producer now."""
        if waiting == 0 or self.deliveries != self._seen:
            self._seen, self._since = self.deliveries, now
            return False
        return now - self._since >= self.stall_s


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


def delivery_error(error: KafkaError, xid: int, confirmed: int) -> CdcError:
    where = f"an event of transaction {xid} was not acknowledged ({error.str()})"
    hint = _PERMANENT_KAFKA_ERRORS.get(error.code())
    if hint is not None or error.fatal():
        return FatalError(
            f"{where}: {hint or 'fatal producer error'}; nothing after {format_lsn(confirmed)} "
            "was confirmed, so restarting after the fix loses nothing"
        )
    return RetriableError(f"{where}; resuming from the confirmed position {format_lsn(confirmed)}")


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

    def lag_seconds(self) -> float:
        if self.last_commit_time is None:
            return 0.0
        return max(0.0, (datetime.now(UTC) - self.last_commit_time).total_seconds())


@dataclass(frozen=True)
class PostgresEndpoint:
    """One PostgreSQL source as capture needs it: names resolved, tables and topics."""

    name: str
    config: PostgresSource
    tables: Sequence[TableConfig]
    topics: Mapping[str, str]  # table key -> topic
    slot: str
    publication: str
    heartbeat_topic: str
    server_name: str  # Debezium's topic.prefix: source.name in every envelope

    def conninfo(self, purpose: str) -> str:
        return self.config.conninfo(self.name, f"cdc_platform_{purpose}_{self.name}")

    def connect(self, purpose: str) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(self.conninfo(purpose), autocommit=True)
        except psycopg.OperationalError as exc:
            raise classify_postgres_error(exc, source=self.name, user=self.config.user, slot=self.slot) from None

    def classify(self, exc: BaseException) -> CdcError:
        return classify_postgres_error(exc, source=self.name, user=self.config.user, slot=self.slot)


class PostgresCapture:
    """One source database's capture: publication + slot + Kafka topics + the stream."""

    def __init__(self, endpoint: PostgresEndpoint, kafka: KafkaClients, settings: CaptureSettings) -> None:
        if not endpoint.tables:
            raise FatalError(f"source '{endpoint.name}' has no tables in the config; add some under tables:")
        self.endpoint, self.kafka, self.settings = endpoint, kafka, settings
        source = endpoint.config
        self.codec = EnvelopeCodec(
            server_name=endpoint.server_name,
            database=source.database,
            with_schema=source.envelope_schemas,
            options=ConversionOptions(source.decimal_handling, source.interval_handling),
        )
        self.stats = CaptureStats()
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}
        self._topics = {(t.schema_name, t.table_name): endpoint.topics[t.key] for t in endpoint.tables}
        self._types: dict[int, PgType] = {}
        self._stop = False
        self._slot_unrecorded = False  # created, not yet in the heartbeat topic

    # -- preflight: everything that is fatal if wrong -----------------------------------------
    def preflight(self) -> int:
        """Check tables, keys, publication, slot and topics. Returns the slot's confirmed LSN."""
        endpoint = self.endpoint
        with endpoint.connect("capture") as conn:
            for table in endpoint.tables:
                self._keys[(table.schema_name, table.table_name)] = self._check_table(conn, table)
            self._ensure_publication(conn)
            confirmed, created = self._ensure_slot(conn)
        # a slot created by an attempt that failed afterwards (Kafka not up yet) is recorded
        # by the retry, which finds the slot there
        self._slot_unrecorded = self._slot_unrecorded or created
        self.kafka.ensure_topics(list(endpoint.topics.values()), [endpoint.heartbeat_topic])
        if self._slot_unrecorded:
            # remember the slot durably (the heartbeat topic is compacted, keyed by source):
            # if it disappears later, the next start knows changes were lost
            producer = self.kafka.producer()
            self._heartbeat(producer, confirmed)
            if producer.flush(30) != 0:
                raise RetriableError("could not record the new slot in the heartbeat topic")
            self._slot_unrecorded = False
        return confirmed

    def _check_table(self, conn: psycopg.Connection[tuple[Any, ...]], table: TableConfig) -> tuple[str, ...]:
        described = describe_table(conn, table.schema_name, table.table_name)
        key = keyed_schema(conn, described, table.primary_key, f"tables[{table.key}].primary_key").key
        if described.replica_identity == "nothing":
            raise SourceTableError(
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
        return key

    def _ensure_publication(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        publication = self.endpoint.publication
        owner = conn.execute(
            "SELECT pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        missing = self._unpublished(conn) if owner else list(self.endpoint.tables)
        if not missing:
            return
        idents = sql.SQL(", ").join(
            sql.SQL("{}.{}").format(sql.Identifier(t.schema_name), sql.Identifier(t.table_name)) for t in missing
        )
        verb = "ALTER PUBLICATION {} ADD TABLE {}" if owner else "CREATE PUBLICATION {} FOR TABLE {}"
        statement = sql.SQL(verb).format(sql.Identifier(publication), idents)
        try:
            conn.execute(statement)
            log.info("publication %s: %s", publication, statement.as_string(conn))
        except psycopg.errors.InsufficientPrivilege as exc:
            who = publication_fix_role(conn, missing, str(owner[0]) if owner else None)
            raise FatalError(
                f"source '{self.endpoint.name}': role {self.endpoint.config.user} may not create or change "
                f"publication {publication} ({' '.join(str(exc).split())}); {who} run: {statement.as_string(conn)}"
            ) from None

    def _unpublished(self, conn: psycopg.Connection[tuple[Any, ...]]) -> list[TableConfig]:
        published = {
            (str(r[0]), str(r[1]))
            for r in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.endpoint.publication,),
            )
        }
        return [t for t in self.endpoint.tables if (t.schema_name, t.table_name) not in published]

    def _ensure_slot(self, conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[int, bool]:
        """(the slot's confirmed position, whether it was created now)."""
        endpoint = self.endpoint
        state = read_slot(conn, endpoint.slot)
        if state is None:
            self._refuse_silent_replacement()
            try:
                created = create_slot(conn, endpoint.slot)
            except psycopg.Error as exc:
                raise endpoint.classify(exc) from None
            log.info("created replication slot %s at %s", endpoint.slot, format_lsn(created))
            return created, True
        check_slot_usable(endpoint.name, state)
        return state.confirmed, False

    def _refuse_silent_replacement(self) -> None:
        previous = last_heartbeat(self.kafka, self.endpoint)
        if previous is None or previous.get("slot") != self.endpoint.slot or self.settings.new_slot:
            return
        raise SlotLostError(
            f"source '{self.endpoint.name}': replication slot {self.endpoint.slot} no longer exists, but capture "
            f"confirmed changes up to {format_lsn(int(previous.get('lsn', 0)))} with it: the changes "
            "since are gone. The captured tables must be rehydrated (new snapshot generation); then "
            "run capture with --new-slot to start a new slot."
        )

    # -- types ------------------------------------------------------------------------------
    def _resolve_types(self, oids: Iterable[int]) -> None:
        if all(o in self._types for o in oids):
            return
        with self.endpoint.connect("capture") as conn:
            resolve_pg_types(conn, oids, self._types)

    def _shape(self, relation: pgoutput.Relation) -> TableShape | None:
        ident = (relation.namespace, relation.name)
        if ident not in self._topics:
            # a shared publication may hold more tables than this config captures
            log.warning(
                "publication %s publishes %s.%s, which is not in the config: its changes are skipped",
                self.endpoint.publication,
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
            raise FatalError(f"{relation.namespace}.{relation.name}: key column(s) {missing} were dropped")
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
        before the start is in Kafka). Retriable errors reconnect with backoff, before the
        first change too: a database or broker still starting is waited for, not fatal."""
        backoff = Backoff(self.settings.max_reconnect_wait_s, self.settings.give_up_after_s)
        prepared, target = False, None
        while True:
            if self._stop:  # stopped while waiting for the database or broker
                return self.stats
            try:
                if not prepared:
                    self.stats.confirmed_lsn = self.preflight()
                    target = self._server_position() if self.settings.until_caught_up else None
                    prepared = True
                if self._stream(target) or self._stop:
                    return self.stats
                backoff.reset()
            except (psycopg2.Error, psycopg.Error, RetriableError) as exc:
                error = exc if isinstance(exc, RetriableError) else self.endpoint.classify(exc)
                if not error.retriable:
                    raise error from None
                self.stats.reconnects += 1
                backoff.failed(error)

    def _server_position(self) -> int:
        with self.endpoint.connect("capture") as conn:
            return current_wal_position(conn)

    def _replication_connect(self) -> Any:
        try:
            return psycopg2.connect(
                self.endpoint.conninfo("capture"),
                options=SESSION_OPTIONS,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
            )
        except psycopg2.OperationalError as exc:
            raise self.endpoint.classify(exc) from None

    def _stream(self, target: int | None) -> bool:
        """One replication session. Returns True when caught up (bounded mode)."""
        producer = self.kafka.producer()
        repl = self._replication_connect()
        try:
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.endpoint.slot,
                decode=False,
                options={"proto_version": "1", "publication_names": self.endpoint.publication},
                status_interval=10,
            )
            return _Session(self, cur, producer, target).consume()
        finally:
            # deliver what is in flight (their acks no longer move the slot: a new session
            # resumes from the confirmed position, so anything unconfirmed is re-sent)
            producer.flush(10)
            with contextlib.suppress(psycopg2.Error):
                repl.close()

    def records(
        self,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete | pgoutput.Truncate,
        relations: dict[int, TableShape | None],
        position: SourcePosition,
        now_us: int,
    ) -> list[Record]:
        codec = self.codec
        if isinstance(message, pgoutput.Truncate):
            out: list[Record] = []
            for relation_id in message.relation_ids:
                truncated = relations.get(relation_id)
                if truncated is not None:
                    out += codec.truncate_records(truncated, position, now_us, self.kafka.kafka.partitions)
            return out
        shape = relations.get(message.relation_id)
        if shape is None:
            return []
        op: Literal["c", "u", "d"] = "c" if isinstance(message, pgoutput.Insert) else "u"
        if isinstance(message, pgoutput.Delete):
            op = "d"
        new = None if isinstance(message, pgoutput.Delete) else message.new
        old = None if isinstance(message, pgoutput.Insert) else message.old
        full = not isinstance(message, pgoutput.Insert) and message.old_kind == "O"
        try:
            return codec.change_records(shape, op, new, old, full, position, now_us)
        except ConversionError as exc:  # never a reason to stop every table of the source
            log.warning(
                "capture %s: %s.%s at LSN %s: %s; sent to %s as an unconvertible-value event (the lake "
                "dead-letters it or stops this table, per its errors.tolerance); the other tables keep streaming",
                self.endpoint.name, shape.schema, shape.table, format_lsn(position.lsn), exc, shape.topic,
            )  # fmt: skip
            return [codec.unconvertible_record(shape, op, new if new is not None else old, position, now_us, exc)]

    def _heartbeat(
        self, producer: Producer, confirmed: int, lag_s: float = 0.0, on_delivery: Callable[..., None] | None = None
    ) -> None:
        """Debezium-style heartbeat record: consumers of quiet topics still see time pass,
        and ``capture status`` reads position and lag from the latest one."""
        key = json.dumps({"serverName": self.endpoint.server_name}, separators=(",", ":")).encode()
        heartbeat = {"ts_ms": int(time.time() * 1000), "lsn": confirmed, "slot": self.endpoint.slot,
                     "lag_seconds": round(lag_s, 3)}  # fmt: skip
        with contextlib.suppress(BufferError):  # a full queue: skip this heartbeat
            producer.produce(
                self.endpoint.heartbeat_topic, key=key, value=json.dumps(heartbeat).encode(), on_delivery=on_delivery
            )

    def report(self, confirmed: int) -> None:
        lag_s = self.stats.lag_seconds()
        log.info(
            "capture %s: confirmed %s, %d transactions, events %s, last commit lag %.1f s",
            self.endpoint.name, format_lsn(confirmed), self.stats.transactions, dict(self.stats.events), lag_s,
        )  # fmt: skip
        status_file = self.settings.status_file
        if status_file is not None:
            status_file.parent.mkdir(parents=True, exist_ok=True)
            status = {**self.stats.as_dict(), "lag_seconds": lag_s, "updated_at": datetime.now(UTC).isoformat()}
            tmp = status_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(status, indent=2))
            tmp.replace(status_file)


class _Session:
    """One replication session's loop: decode, produce, confirm what Kafka acknowledged."""

    def __init__(self, capture: PostgresCapture, cur: Any, producer: Producer, target: int | None) -> None:
        self.capture, self.cur, self.producer, self.target = capture, cur, producer, target
        self.tracker = AckTracker(capture.stats.confirmed_lsn)
        self.relations: dict[int, TableShape | None] = {}
        self.txn: _Transaction | None = None
        self.last_feedback = self.last_status = self.last_heartbeat = time.monotonic()
        self.reported = self.tracker.confirmed
        self.watch = DeliveryWatch(DELIVERY_STALL_S, self.last_feedback)

    def consume(self) -> bool:
        while not self.capture._stop:
            msg = self.cur.read_message()
            if msg is None:
                if self._idle(time.monotonic()):
                    return True
                select.select([self.cur.connection], [], [], 0.2)
                continue
            self._message(msg)
        self.producer.flush(30)
        confirmed = self.tracker.advance()
        self.cur.send_feedback(write_lsn=confirmed, flush_lsn=confirmed, force=True)
        self.capture.stats.confirmed_lsn = confirmed
        self.capture.report(confirmed)
        return False

    def _idle(self, now: float) -> bool:
        """No message waiting: confirm, heartbeat, report. True when caught up (bounded mode)."""
        capture, tracker = self.capture, self.tracker
        self.producer.poll(0)
        waiting = len(self.producer)
        if self.watch.stalled(waiting, now):
            raise RetriableError(
                f"{waiting} message(s) waited {DELIVERY_STALL_S:.0f} s in the Kafka producer without a delivery "
                "report (a broker back from a restart can leave a producer on stale partition leaders); "
                "reconnecting with a new producer"
            )
        confirmed = tracker.advance()
        if self.txn is None and waiting == 0 and self.cur.wal_end:
            confirmed = tracker.idle_advance(int(self.cur.wal_end))
        caught_up = self.target is not None and self.txn is None and tracker.idle and confirmed >= self.target
        if confirmed != self.reported or now - self.last_feedback >= FEEDBACK_EVERY_S or caught_up:
            # ask for a keepalive while catching up, so idle positions arrive promptly
            self.cur.send_feedback(write_lsn=confirmed, flush_lsn=confirmed, reply=self.target is not None, force=True)
            self.reported, self.last_feedback = confirmed, now
        capture.stats.confirmed_lsn = confirmed
        if now - self.last_heartbeat >= capture.endpoint.config.heartbeat_interval_s:
            lag = 0.0 if tracker.idle and self.txn is None else capture.stats.lag_seconds()
            capture._heartbeat(self.producer, confirmed, lag, on_delivery=lambda _err, _msg: self.watch.delivered())
            self.last_heartbeat = now
        if caught_up or now - self.last_status >= capture.settings.status_interval_s:
            capture.report(confirmed)
            self.last_status = now
        return caught_up

    def _message(self, msg: Any) -> None:
        message = pgoutput.decode(msg.payload)
        if isinstance(message, pgoutput.Begin):
            self.txn = self.tracker.begin(message.final_lsn, message.xid, message.commit_time)
        elif isinstance(message, pgoutput.Commit):
            if self.txn is not None:
                self.tracker.commit(self.txn, message.end_lsn)
                self.capture.stats.transactions += 1
                self.capture.stats.last_commit_time = message.commit_time
            self.txn = None
            self.producer.poll(0)
        elif isinstance(message, pgoutput.Relation):
            self.relations[message.relation_id] = self.capture._shape(message)
        elif isinstance(message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete | pgoutput.Truncate):
            if self.txn is None:
                raise RetriableError("change outside a transaction; resynchronising")
            txn = self.txn
            position = SourcePosition(txn.commit_lsn, int(msg.data_start), txn.xid, txn.commit_time)
            for record in self.capture.records(message, self.relations, position, time.time_ns() // 1000):
                self._produce(record, txn)
        # Origin and Type messages need no action (types are resolved from the catalog)

    def _produce(self, record: Record, owner: _Transaction) -> None:
        self.tracker.sent(owner)
        callback = _delivery(self.tracker, owner, self.watch)
        while True:
            try:
                self.producer.produce(
                    record.topic,
                    key=record.key,
                    value=record.value,
                    on_delivery=callback,
                    partition=-1 if record.partition is None else record.partition,  # -1: the partitioner
                )
                break
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.1)
        self.capture.stats.events["unconvertible" if record.unconvertible else record.op or "tombstone"] += 1


def _delivery(
    tracker: AckTracker, txn: _Transaction, watch: DeliveryWatch
) -> Callable[[KafkaError | None, Message], None]:
    def callback(err: KafkaError | None, _msg: Message) -> None:
        watch.delivered()
        tracker.acked(txn, err)

    return callback


def check_slot_usable(source: str, state: SlotState) -> None:
    if state.wal_status == "lost":
        raise SlotLostError(
            f"source '{source}': replication slot {state.name} is invalidated (wal_status=lost): "
            "PostgreSQL removed WAL it still needed. The captured tables must be rehydrated (new snapshot "
            f"generation); drop the slot (SELECT pg_drop_replication_slot('{state.name}')) and restart capture."
        )
    if state.plugin != "pgoutput":
        raise FatalError(
            f"replication slot {state.name} uses plugin {state.plugin}, not pgoutput; drop it or set slot_name"
        )
    if state.active_pid is not None:
        raise FatalError(
            f"source '{source}': replication slot {state.name} is in use by backend pid {state.active_pid}; "
            "run only one capture per source"
        )


def last_heartbeat(kafka: KafkaClients, endpoint: PostgresEndpoint) -> dict[str, Any] | None:
    """The newest heartbeat record of this source, or None if there is none."""
    value = kafka.last_value(endpoint.heartbeat_topic, f"heartbeat.{endpoint.name}")
    if value is None:
        return None
    parsed = json.loads(value)
    return parsed if isinstance(parsed, dict) else None


def publication_fix_role(
    conn: psycopg.Connection[tuple[Any, ...]], tables: Sequence[TableConfig], owner: str | None
) -> str:
    """Who may run the publication statement: PostgreSQL requires owning the publication
    (to alter it) and every table added to it, or a superuser."""
    table_owners = sorted(
        {
            str(r[0])
            for t in tables
            for r in conn.execute(
                "SELECT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s",
                (t.schema_name, t.table_name),
            )
        }
    )
    owns = f"the table(s) ({', '.join(table_owners) or 'their owner'})"
    if owner is None:
        return f"as a superuser, or as the role that owns {owns},"
    return f"as a superuser, or as a role that owns both publication (now {owner}) and {owns},"
