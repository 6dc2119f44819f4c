"""Query-based capture: poll a MariaDB/MySQL table into Kafka, at least once.

For databases without a usable replication feed (the first trade-off in the design notes:
log-based capture is better; polling is easier to deploy). Each table is read in cursor
order, one batch of ``batch_size`` rows per query, in one of Kafka Connect's JDBC modes:

* ``incrementing``: ``WHERE id > :id ORDER BY id`` — new rows only; updates are not seen.
* ``timestamp``: ``WHERE ts > :ts ORDER BY ts`` — inserts and updates. A batch always ends
  at a timestamp boundary (all rows sharing the last timestamp are read, whatever the
  batch size), because the next query starts *after* that timestamp.
* ``timestamp+incrementing``: ``WHERE ts > :ts OR (ts = :ts AND id > :id) ORDER BY ts, id``
  — the compound cursor: rows sharing a timestamp are never skipped, batches can end
  anywhere.

**Cursor.** Stored durably in a compacted Kafka topic (``__cdc-offsets.<prefix>``, like
Kafka Connect's offset topic), one record per table, written only after Kafka
acknowledged every event of the batch. A crash re-reads at most the unacknowledged batch
(duplicates, which the lake ignores); nothing acknowledged is lost.

**Positions.** Events carry a position in ``source.lsn``/``source.sequence`` (where the
log-based source puts the LSN): the database clock at the start of the poll, in
nanoseconds, plus the row's index in the batch, and always above the previous position
(stored with the cursor). A snapshot generation takes the same clock as its watermark,
so current applies exactly the polls that started after it.

**Ops.** ``c`` for a row whose incrementing value is above every one published before
(incrementing and timestamp+incrementing modes); ``u`` otherwise — timestamp mode cannot
tell an insert from an update, and consumers treat both as upserts. A row whose
``soft_delete_column`` is set becomes ``d`` plus a tombstone. **Hard deletes are not
visible to polling**: reconciliation generations (``poll.reconcile_every``) drop them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pymysql
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cdc_platform.capture.errors import Backoff, CaptureError, FatalCaptureError, RetriableCaptureError
from cdc_platform.capture.mysql_catalog import (
    MappedColumn,
    describe_mysql_table,
    pg_text,
    quote_mysql,
    soft_deleted,
)
from cdc_platform.capture.pg_catalog import SourceTableError, resolve_key
from cdc_platform.capture.topics import ensure_topics, producer_config
from cdc_platform.config import JdbcSource, PlatformConfig, TableConfig
from cdc_platform.config.model import PollConfig
from cdc_platform.envelope.debezium import CONNECTOR_VERSION, ColumnSpec, EnvelopeCodec, TableShape
from cdc_platform.envelope.pgtypes import ConversionOptions, builtin_type

log = logging.getLogger("cdc_platform.capture.jdbc")

INTEGER_KINDS = {"int16", "int32", "int64"}
TIMESTAMP_KINDS = {"timestamp", "timestamptz"}
# the database clock, in nanoseconds since the epoch: positions and watermarks both use it
CLOCK_SQL = "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
CAUGHT_UP_EVERY_NS = 10 * 1_000_000_000


def offsets_topic(config: PlatformConfig, source_name: str) -> str:
    return f"__cdc-offsets.{config.sources[source_name].topic_prefix or source_name}"


def connect_mysql(source: JdbcSource, source_name: str, purpose: str) -> Any:
    """A PyMySQL connection in a UTC session (TIMESTAMP values read as UTC), autocommit, so
    every poll query sees the newest committed rows. Errors are classified (no secrets)."""
    try:
        return pymysql.connect(
            host=source.host,
            port=source.port,
            user=source.user,
            password=source.password(source_name).get_secret_value(),
            database=source.database,
            connect_timeout=source.connect_timeout_s,
            autocommit=True,
            charset="utf8mb4",
            init_command="SET time_zone = '+00:00'",
            program_name=f"cdc_platform_{purpose}",
        )
    except pymysql.err.MySQLError as exc:
        raise classify_mysql_error(exc, source_name, source) from None


def classify_mysql_error(exc: BaseException, source_name: str, source: JdbcSource) -> CaptureError:
    """Retriable (server down, connection lost) or fatal (credentials, database, privileges)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = " ".join(str(exc.args[1] if len(exc.args) > 1 else exc).split())
    if code == 1045:
        return FatalCaptureError(
            f"source '{source_name}': bad credentials for user {source.user} ({text}); fix sources.{source_name}.user "
            f"or the password in the environment variable named by sources.{source_name}.password_env"
        )
    if code == 1049:
        return FatalCaptureError(f"source '{source_name}': {text}; fix sources.{source_name}.database")
    if code in (1142, 1143, 1044):
        return FatalCaptureError(
            f"source '{source_name}': user {source.user} may not read the table ({text}); as an admin run: "
            f"GRANT SELECT ON <database>.* TO '{source.user}'@'<host>'"
        )
    if code in (1146, 1054):
        return FatalCaptureError(f"source '{source_name}': {text}; fix the table or column names in the config")
    return RetriableCaptureError(
        f"source '{source_name}': cannot query {source.host}:{source.port} ({text}); is the database up?"
    )


def database_clock_ns(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(CLOCK_SQL)
        row = cur.fetchone()
    return int(row[0]) * 1000


@dataclass
class TableCursor:
    """Where polling of one table stands; the record stored in the offsets topic."""

    mode: str
    timestamp: str | None = None  # the timestamp column's value, as DATE_FORMAT prints it
    incrementing: int | None = None
    max_incrementing: int | None = None  # highest incrementing value ever published (c vs u)
    position: int = 0  # the last position published
    rows: int = 0  # rows published so far
    initialized: bool = False  # False: no poll has run yet (initial: latest still to apply)
    # database clock (ns) at the start of the latest poll that read to the end of the table:
    # every change committed before it is in Kafka (what `verify` waits for)
    caught_up_at: int = 0
    committed_at: str | None = None

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("timestamp", self.timestamp), ("incrementing", self.incrementing)) if v]
        return ", ".join(parts) or "start"


@dataclass
class PolledTable:
    config: TableConfig
    poll: PollConfig
    shape: TableShape
    mapped: list[MappedColumn]
    topic: str
    cursor: TableCursor
    soft_delete_index: int | None = None


@dataclass
class PollStats:
    polls: int = 0
    events: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    cursors: dict[str, str] = field(default_factory=dict)
    reconnects: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "polls": self.polls,
            "events": dict(self.events),
            "rows": dict(self.rows),
            "cursors": dict(self.cursors),
            "reconnects": self.reconnects,
        }


@dataclass(frozen=True)
class PollOptions:
    until_caught_up: bool = False  # stop after the first round in which every table is caught up
    max_reconnect_wait_s: float = 30.0
    give_up_after_s: float | None = None  # None: retry forever (a long-running worker)
    status_file: Path | None = None


class PollingCapture:
    """One jdbc source's polling: its tables, their topics and stored cursors."""

    def __init__(self, config: PlatformConfig, source_name: str, options: PollOptions | None = None) -> None:
        if source_name not in config.sources:
            raise FatalCaptureError(
                f"no source '{source_name}' in the config (sources: {', '.join(sorted(config.sources))})"
            )
        self.config = config
        self.source_name = source_name
        self.source = config.jdbc(source_name)
        self.options = options or PollOptions()
        self.server_name = self.source.topic_prefix or source_name
        self.codec = EnvelopeCodec(
            server_name=self.server_name,
            database=self.source.database,
            options=ConversionOptions(self.source.decimal_handling),
        )
        self.offsets_topic = offsets_topic(config, source_name)
        self.tables: list[PolledTable] = []
        self.stats = PollStats()
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    # -- preflight: everything that is fatal if wrong -----------------------------------------
    def preflight(self) -> None:
        tables = [t for t in self.config.tables if t.source == self.source_name]
        if not tables:
            raise FatalCaptureError(f"source '{self.source_name}' has no tables in the config; add some under tables:")
        topics = {t.key: self.config.topic_for(t) for t in tables}
        ensure_topics(self.config.kafka, list(topics.values()), [self.offsets_topic])
        stored = read_stored_cursors(self.config, self.source_name)
        conn = connect_mysql(self.source, self.source_name, "poll")
        try:
            self.tables = [self._prepare(conn, t, topics[t.key], stored.get(t.key)) for t in tables]
        except pymysql.err.MySQLError as exc:
            raise classify_mysql_error(exc, self.source_name, self.source) from None
        finally:
            conn.close()

    def _prepare(self, conn: Any, table: TableConfig, topic: str, stored: TableCursor | None) -> PolledTable:
        assert table.poll is not None  # the config requires it for jdbc sources
        poll = table.poll
        try:
            described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
            key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
        except SourceTableError as exc:
            raise FatalCaptureError(str(exc)) from None
        kinds = {}
        columns = []
        for c in described.columns:
            pgtype = builtin_type(c.type_oid)
            assert pgtype is not None  # the mapping only lands on built-in types
            kinds[c.name] = pgtype.kind
            columns.append(ColumnSpec(c.name, pgtype, c.type_modifier, nullable=c.nullable and c.name not in key))
        where = f"tables[{table.key}].poll"
        if poll.incrementing_column is not None and kinds.get(poll.incrementing_column) not in INTEGER_KINDS:
            raise FatalCaptureError(
                f"{where}.incrementing_column: '{poll.incrementing_column}' is "
                f"{'not a column' if poll.incrementing_column not in kinds else 'not an integer column'} of "
                f"{table.key}; name a strictly increasing integer column (e.g. an AUTO_INCREMENT id)"
            )
        if poll.timestamp_column is not None and kinds.get(poll.timestamp_column) not in TIMESTAMP_KINDS:
            raise FatalCaptureError(
                f"{where}.timestamp_column: '{poll.timestamp_column}' is "
                f"{'not a column' if poll.timestamp_column not in kinds else 'not a datetime/timestamp column'} of "
                f"{table.key}; name a column set on every insert and update "
                "(updated_at DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6))"
            )
        soft_index = None
        if poll.soft_delete_column is not None:
            if poll.soft_delete_column not in kinds:
                raise FatalCaptureError(
                    f"{where}.soft_delete_column: '{poll.soft_delete_column}' is not a column of {table.key}"
                )
            soft_index = [c.name for c in described.columns].index(poll.soft_delete_column)
        cursor = stored if stored is not None and stored.mode == poll.mode else TableCursor(poll.mode)
        if stored is not None and stored.mode != poll.mode:
            log.warning(
                "%s: poll mode changed from %s to %s: the cursor starts over", table.key, stored.mode, poll.mode
            )
        shape = TableShape(
            schema=table.schema_name,
            table=table.table_name,
            columns=tuple(columns),
            key_columns=key,
            full_identity=True,
            topic=topic,
        )
        self.stats.cursors[table.key] = cursor.describe()
        self.stats.rows.setdefault(table.key, 0)
        return PolledTable(table, poll, shape, mapped, topic, cursor, soft_index)

    # -- stored cursors -------------------------------------------------------------------------
    def _cursor_key(self, table: TableConfig) -> bytes:
        return json.dumps({"source": self.source_name, "table": table.key}, separators=(",", ":")).encode()

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> PollStats:
        """Poll until stopped (or, with ``until_caught_up``, until a round finds every table
        caught up). Retriable errors reconnect with backoff; fatal ones raise at once."""
        backoff = Backoff(self.options.max_reconnect_wait_s, self.options.give_up_after_s, self._sleep)
        while not self._stop:
            try:
                if not self.tables:  # a database or broker still starting is retried like any poll
                    self.preflight()
                caught_up = self.poll_round()
                backoff.reset()
                if caught_up and self.options.until_caught_up:
                    return self.stats
                self._sleep(self.source.poll_interval_s)
            except (pymysql.err.MySQLError, RetriableCaptureError) as exc:
                error = (
                    exc
                    if isinstance(exc, RetriableCaptureError)
                    else classify_mysql_error(exc, self.source_name, self.source)
                )
                if not error.retriable:
                    raise error from None
                self.stats.reconnects += 1
                backoff.failed(error)
        return self.stats

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def poll_round(self) -> bool:
        """Poll every table until it is caught up (a batch shorter than batch_size) or the
        poller is stopped. Returns True when every table was caught up."""
        producer = Producer(producer_config(self.config.kafka))
        conn = connect_mysql(self.source, self.source_name, "poll")
        try:
            caught_up = True
            for table in self.tables:
                while not self._stop:
                    _, full = self.poll_batch(conn, producer, table)
                    if not full:
                        break
                else:
                    caught_up = False
            self.stats.polls += 1
            self._report()
            return caught_up
        finally:
            producer.flush(10)
            with contextlib.suppress(pymysql.err.MySQLError):
                conn.close()

    def poll_batch(self, conn: Any, producer: Producer, table: PolledTable) -> tuple[int, bool]:
        """One query, its events into Kafka, then the cursor. Returns (rows published, batch full)."""
        cursor = table.cursor
        clock_ns = database_clock_ns(conn)
        if not cursor.initialized and table.poll.initial == "latest":
            self._start_at_latest(conn, table)
            self._commit_cursor(producer, table, cursor)
            return 0, False
        rows, full = self._query(conn, table)
        if not rows:
            # a quiet table still records that it was read to the end (at most every 10 s)
            if not cursor.initialized or clock_ns - cursor.caught_up_at >= CAUGHT_UP_EVERY_NS:
                cursor.initialized = True
                cursor.caught_up_at = clock_ns
                self._commit_cursor(producer, table, cursor)
            return 0, False
        base = max(clock_ns, cursor.position + 1)
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        ops: Counter[str] = Counter()
        next_cursor = TableCursor(**asdict(cursor))
        for i, row in enumerate(rows):
            values, ts_value, inc_value = row[:-2], row[-2], row[-1]
            position = base + i
            op = self._op(table, values, inc_value, next_cursor)
            for key, value in self._records(table, op, values, position, clock_ns, ts_value, inc_value):
                self._produce(producer, table.topic, key, value, delivered)
            ops[op] += 1
            next_cursor.timestamp = ts_value if ts_value is not None else next_cursor.timestamp
            next_cursor.incrementing = int(inc_value) if inc_value is not None else next_cursor.incrementing
            if inc_value is not None:
                next_cursor.max_incrementing = max(next_cursor.max_incrementing or int(inc_value), int(inc_value))
            next_cursor.position = position
        remaining = producer.flush(60)
        if remaining or errors:
            # the cursor stays where it was: the batch is read and sent again (duplicates only)
            reason = str(errors[0]) if errors else f"{remaining} events not acknowledged within 60 s"
            fatal = any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors)
            message = f"{table.config.key}: Kafka did not acknowledge the batch ({reason}); the cursor did not move"
            raise FatalCaptureError(message) if fatal else RetriableCaptureError(message)
        next_cursor.rows += len(rows)
        next_cursor.initialized = True
        if not full:
            next_cursor.caught_up_at = clock_ns
        self._commit_cursor(producer, table, next_cursor)
        table.cursor = next_cursor
        self.stats.events.update(ops)
        self.stats.rows[table.config.key] = self.stats.rows.get(table.config.key, 0) + len(rows)
        self.stats.cursors[table.config.key] = next_cursor.describe()
        log.info(
            "poll %s: %d rows (%s), cursor %s",
            table.config.key,
            len(rows),
            ", ".join(f"{k} {v}" for k, v in sorted(ops.items())),
            next_cursor.describe(),
        )
        return len(rows), full

    def _produce(self, producer: Producer, topic: str, key: bytes, value: bytes | None, callback: Any) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=callback)
                return
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.5)

    def _op(self, table: PolledTable, values: tuple[Any, ...], inc_value: Any, cursor: TableCursor) -> str:
        index = table.soft_delete_index
        if index is not None and soft_deleted(values[index], table.mapped[index]):
            return "d"
        if table.poll.mode == "incrementing":
            return "c"
        if inc_value is not None and (cursor.max_incrementing is None or int(inc_value) > cursor.max_incrementing):
            return "c"
        return "u"

    def _records(
        self,
        table: PolledTable,
        op: str,
        values: tuple[Any, ...],
        position: int,
        clock_ns: int,
        ts_value: str | None,
        inc_value: Any,
    ) -> list[tuple[bytes, bytes | None]]:
        texts = tuple(pg_text(v, m.decode) for v, m in zip(values, table.mapped, strict=True))
        try:
            image = self.codec.row(table.shape, texts)
            key = self.codec.key_bytes(table.shape, self.codec.key_row(table.shape, texts))
        except ValueError as exc:
            raise FatalCaptureError(f"{table.config.key}: {exc}") from None
        now_us = time.time_ns() // 1000
        poll_us = clock_ns // 1000
        cursor: dict[str, Any] = {}
        if ts_value is not None:
            cursor["timestamp"] = ts_value
        if inc_value is not None:
            cursor["incrementing"] = int(inc_value)
        source = {
            "version": CONNECTOR_VERSION,
            "connector": "jdbc",
            "name": self.server_name,
            "ts_ms": poll_us // 1000,
            "snapshot": "false",
            "db": table.shape.schema,
            "sequence": f'["{position}","{position}"]',
            "ts_us": poll_us,
            "ts_ns": clock_ns,
            "schema": table.shape.schema,
            "table": table.shape.table,
            "txId": None,
            "lsn": position,
            "xmin": None,
            "mode": table.poll.mode,
            "cursor": cursor,
        }
        payload = {
            "before": image if op == "d" else None,
            "after": None if op == "d" else image,
            "source": source,
            "transaction": None,
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
        }
        value = orjson.dumps(payload)  # compact UTF-8, like the log-based capture's envelope
        records: list[tuple[bytes, bytes | None]] = [(key, value)]
        if op == "d":
            records.append((key, None))  # tombstone: compaction may drop the row's events
        return records

    def _query(self, conn: Any, table: PolledTable) -> tuple[list[tuple[Any, ...]], bool]:
        poll, cursor, limit = table.poll, table.cursor, self.source.batch_size
        # every statement runs with parameters, so a literal % is written %%
        select = ", ".join(m.select_sql for m in table.mapped).replace("%", "%%")
        ts_col = quote_mysql(poll.timestamp_column) if poll.timestamp_column else None
        inc_col = quote_mysql(poll.incrementing_column) if poll.incrementing_column else None
        ts_text = f"DATE_FORMAT({ts_col}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')" if ts_col else "NULL"
        source = f"{quote_mysql(table.shape.schema)}.{quote_mysql(table.shape.table)}"
        head = f"SELECT {select}, {ts_text}, {inc_col or 'NULL'} FROM {source}"
        conditions: list[str] = []
        params: list[Any] = []
        if ts_col:
            conditions.append(f"{ts_col} IS NOT NULL")
            if poll.timestamp_delay_s > 0:
                conditions.append(f"{ts_col} < NOW(6) - INTERVAL {int(poll.timestamp_delay_s * 1_000_000)} MICROSECOND")
        if poll.mode == "incrementing":
            if cursor.incrementing is not None:
                conditions.append(f"{inc_col} > %s")
                params.append(cursor.incrementing)
            order = f"{inc_col}"
        elif poll.mode == "timestamp":
            if cursor.timestamp is not None:
                conditions.append(f"{ts_col} > %s")
                params.append(cursor.timestamp)
            order = f"{ts_col}"
        else:
            if cursor.timestamp is not None:
                conditions.append(f"({ts_col} > %s OR ({ts_col} = %s AND {inc_col} > %s))")
                params += [cursor.timestamp, cursor.timestamp, cursor.incrementing or 0]
            order = f"{ts_col}, {inc_col}"
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        with conn.cursor() as cur:
            cur.execute(f"{head}{where} ORDER BY {order} LIMIT {limit}", params)
            rows = list(cur.fetchall())
            full = len(rows) == limit
            if full and poll.mode == "timestamp":
                # the next query starts after the last timestamp: read every row that shares it
                last = rows[-1][-2]
                rows = [r for r in rows if r[-2] != last]
                tie = [*conditions[: len(conditions) - (1 if cursor.timestamp is not None else 0)], f"{ts_col} = %s"]
                tie_params = [last]
                cur.execute(f"{head} WHERE {' AND '.join(tie)} ORDER BY {order}", tie_params)
                rows += list(cur.fetchall())
        return rows, full

    def _start_at_latest(self, conn: Any, table: PolledTable) -> None:
        poll, cursor = table.poll, table.cursor
        source = f"{quote_mysql(table.shape.schema)}.{quote_mysql(table.shape.table)}"
        parts = []
        if poll.timestamp_column:
            ts = quote_mysql(poll.timestamp_column)
            parts.append(f"DATE_FORMAT(MAX({ts}), '%%Y-%%m-%%d %%H:%%i:%%s.%%f')")
        if poll.incrementing_column:
            parts.append(f"MAX({quote_mysql(poll.incrementing_column)})")
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(parts)} FROM {source}", ())
            row = cur.fetchone()
        values = list(row or [])
        if poll.timestamp_column:
            cursor.timestamp = values.pop(0)
        if poll.incrementing_column:
            top = values.pop(0)
            cursor.incrementing = int(top) if top is not None else None
            cursor.max_incrementing = cursor.incrementing
        if poll.mode == "timestamp+incrementing" and cursor.timestamp is not None:
            # start after the highest id at the newest timestamp (not the table's highest id)
            cursor.incrementing = _max_at(conn, table, cursor.timestamp)
        cursor.initialized = True

    def _commit_cursor(self, producer: Producer, table: PolledTable, cursor: TableCursor) -> None:
        """Store the cursor; only after Kafka acknowledged it is the batch done."""
        cursor.committed_at = datetime.now(UTC).isoformat()
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        value = json.dumps(asdict(cursor), separators=(",", ":")).encode()
        self._produce(producer, self.offsets_topic, self._cursor_key(table.config), value, delivered)
        if producer.flush(60) or errors:
            raise RetriableCaptureError(
                f"{table.config.key}: storing the cursor in {self.offsets_topic} failed "
                f"({errors[0] if errors else 'not acknowledged within 60 s'}); the batch will be re-sent"
            )

    def _report(self) -> None:
        if self.options.status_file is None:
            return
        self.options.status_file.parent.mkdir(parents=True, exist_ok=True)
        status = {**self.stats.as_dict(), "updated_at": datetime.now(UTC).isoformat()}
        tmp = self.options.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=2))
        tmp.replace(self.options.status_file)


def _max_at(conn: Any, table: PolledTable, timestamp: str) -> int | None:
    assert table.poll.timestamp_column and table.poll.incrementing_column
    source = f"{quote_mysql(table.shape.schema)}.{quote_mysql(table.shape.table)}"
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT MAX({quote_mysql(table.poll.incrementing_column)}) FROM {source} "
            f"WHERE {quote_mysql(table.poll.timestamp_column)} = %s",
            (timestamp,),
        )
        row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else None


def read_stored_cursors(config: PlatformConfig, source_name: str) -> dict[str, TableCursor]:
    """table key -> newest stored cursor, from the source's compacted offsets topic."""
    topic = offsets_topic(config, source_name)
    consumer = Consumer(
        {**config.kafka.client_config(), "group.id": f"cdc_platform_offsets_{source_name}", "enable.auto.commit": False}
    )
    found: dict[str, TableCursor] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=15)
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            return found
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        if high <= low:
            return found
        consumer.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            key, value = json.loads(msg.key() or b"{}"), msg.value()
            if key.get("source") == source_name and value is not None:
                found[str(key["table"])] = TableCursor(**json.loads(value))
            if (msg.offset() or 0) >= high - 1:
                return found
        raise RetriableCaptureError(f"reading stored cursors from {topic} timed out")
    except KafkaException as exc:
        raise RetriableCaptureError(f"Kafka unreachable at {config.kafka.bootstrap_servers}: {exc}") from None
    finally:
        consumer.close()
