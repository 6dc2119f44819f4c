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

**Cursor.** Stored durably in a compacted Kafka topic (``cursors.py``), written only after
Kafka acknowledged every event of the batch. A crash re-reads at most the unacknowledged
batch (duplicates, which the lake ignores); nothing acknowledged is lost.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pymysql
from confluent_kafka import KafkaError, Message, Producer

from cdc_platform.config.model import PollConfig, TableConfig
from cdc_platform.envelope.debezium import CONNECTOR_VERSION, ColumnSpec, EnvelopeCodec, TableShape
from cdc_platform.envelope.pgtypes import ConversionOptions, builtin_type
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import FatalError, RetriableError, SourceTableError
from cdc_platform.model.tables import SourceTable
from cdc_platform.sources.backoff import Backoff
from cdc_platform.sources.base import CaptureSettings
from cdc_platform.sources.mysql.catalog import (
    MappedColumn,
    describe_mysql_table,
    pg_text,
    polled_key,
    quote_mysql,
    soft_deleted,
)
from cdc_platform.sources.mysql.connection import MysqlEndpoint, database_clock_ns
from cdc_platform.sources.mysql.cursors import TableCursor, cursor_key, read_stored_cursors

log = logging.getLogger("cdc_platform.capture.poll")

INTEGER_KINDS = {"int16", "int32", "int64"}
TIMESTAMP_KINDS = {"timestamp", "timestamptz"}
CAUGHT_UP_EVERY_NS = 10 * 1_000_000_000
FLUSH_S = 60


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


class PollingCapture:
    """One jdbc source's polling: its tables, their topics and stored cursors."""

    def __init__(self, endpoint: MysqlEndpoint, kafka: KafkaClients, settings: CaptureSettings) -> None:
        self.endpoint, self.kafka, self.settings = endpoint, kafka, settings
        self.source = endpoint.config
        self.codec = EnvelopeCodec(
            server_name=endpoint.server_name,
            database=self.source.database,
            options=ConversionOptions(self.source.decimal_handling),
        )
        self.tables: list[PolledTable] = []
        self.stats = PollStats()
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    # -- preflight: everything that is fatal if wrong -----------------------------------------
    def preflight(self) -> None:
        endpoint = self.endpoint
        if not endpoint.tables:
            raise FatalError(f"source '{endpoint.name}' has no tables in the config; add some under tables:")
        self.kafka.ensure_topics(list(endpoint.topics.values()), [endpoint.offsets_topic])
        stored = read_stored_cursors(self.kafka, endpoint.offsets_topic, endpoint.name)
        conn = endpoint.connect("poll")
        try:
            tables = [self._prepare(conn, t, stored.get(t.key)) for t in endpoint.tables]
            started_at = database_clock_ns(conn)
        except pymysql.err.MySQLError as exc:
            raise endpoint.classify(exc) from None
        finally:
            conn.close()
        self._record_running(tables, started_at)
        self.tables = tables

    def _record_running(self, tables: list[PolledTable], started_at: int) -> None:
        """Each cursor again, not stopped and with this poller's start, before the first
        poll: a check waiting for the next poll would otherwise take this running poller
        for an exited one (a previous poller's stopped mark) or a dead one (no read to the
        end for longer than a running poller leaves) until its first read to the end."""
        for table in tables:
            table.cursor.started_at = started_at
        self._commit_cursors(self.kafka.producer(), tables)
        for table in tables:
            table.cursor.stopped = False

    def _prepare(self, conn: Any, table: TableConfig, stored: TableCursor | None) -> PolledTable:
        assert table.poll is not None  # the config requires it for jdbc sources
        poll = table.poll
        described, mapped = describe_mysql_table(conn, table.schema_name, table.table_name)
        key = polled_key(described, mapped, table.primary_key, f"tables[{table.key}].primary_key")
        check_poll_columns(table, described)
        soft_index = None
        if poll.soft_delete_column is not None:
            soft_index = [c.name for c in described.columns].index(poll.soft_delete_column)
        cursor = stored if stored is not None and stored.mode == poll.mode else TableCursor(poll.mode)
        if stored is not None and stored.mode != poll.mode:
            log.warning(
                "%s: poll mode changed from %s to %s: the cursor starts over", table.key, stored.mode, poll.mode
            )
        columns = tuple(
            ColumnSpec(c.name, _pgtype(c.type_oid), c.type_modifier, nullable=c.nullable and c.name not in key)
            for c in described.columns
        )
        topic = self.endpoint.topics[table.key]
        shape = TableShape(table.schema_name, table.table_name, columns, key, full_identity=True, topic=topic)
        self.stats.cursors[table.key] = cursor.describe()
        self.stats.rows.setdefault(table.key, 0)
        return PolledTable(table, poll, shape, mapped, topic, cursor, soft_index)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> PollStats:
        """Poll until stopped (or, with ``until_caught_up``, until a round finds every table
        caught up). Retriable errors reconnect with backoff; fatal ones raise at once."""
        backoff = Backoff(self.settings.max_reconnect_wait_s, self.settings.give_up_after_s, self._sleep)
        while not self._stop:
            try:
                if not self.tables:  # a database or broker still starting is retried like any poll
                    self.preflight()
                caught_up = self.poll_round()
                backoff.reset()
                if caught_up and self.settings.until_caught_up:
                    break
                self._sleep(self.source.poll_interval_s)
            except (pymysql.err.MySQLError, RetriableError) as exc:
                error = exc if isinstance(exc, RetriableError) else self.endpoint.classify(exc)
                if not error.retriable:
                    raise error from None
                self.stats.reconnects += 1
                backoff.failed(error)
        self._record_stopped()
        return self.stats

    def _record_stopped(self) -> None:
        """Each table's cursor again, marked stopped, so a check waiting for the next poll
        answers at once instead of waiting it out (``MysqlSource.wait_until_captured``)."""
        try:
            self._commit_cursors(self.kafka.producer(), self.tables, stopped=True)
        except RetriableError as exc:  # the cursors stand; a waiting check just waits longer
            log.warning("could not mark the cursors stopped: %s", exc)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def poll_round(self) -> bool:
        """Poll every table until it is caught up (a batch shorter than batch_size) or the
        poller is stopped. Returns True when every table was caught up."""
        producer = self.kafka.producer()
        conn = self.endpoint.connect("poll")
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
            start_at_latest(conn, table)
            self._commit_cursor(producer, table, cursor)
            return 0, False
        rows, full = query_batch(conn, table, self.source.batch_size)
        if not rows:
            # a quiet table still records that it was read to the end (at most every 10 s)
            if not cursor.initialized or clock_ns - cursor.caught_up_at >= CAUGHT_UP_EVERY_NS:
                cursor.initialized = True
                cursor.caught_up_at = clock_ns
                self._commit_cursor(producer, table, cursor)
            return 0, False
        next_cursor, ops = self._publish(producer, table, rows, clock_ns)
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
            table.config.key, len(rows), ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), next_cursor.describe(),
        )  # fmt: skip
        return len(rows), full

    def _publish(
        self, producer: Producer, table: PolledTable, rows: list[tuple[Any, ...]], clock_ns: int
    ) -> tuple[TableCursor, Counter[str]]:
        """The batch's events into Kafka, all acknowledged; the cursor they move to."""
        base = max(clock_ns, table.cursor.position + 1)
        errors: list[KafkaError] = []
        ops: Counter[str] = Counter()
        next_cursor = TableCursor(**asdict(table.cursor))
        for i, row in enumerate(rows):
            values, ts_value, inc_value = row[:-2], row[-2], row[-1]
            op = self._op(table, values, inc_value, next_cursor)
            for key, value in self._records(table, op, values, base + i, clock_ns, ts_value, inc_value):
                _produce(producer, table.topic, key, value, _collect(errors))
            ops[op] += 1
            advance_cursor(next_cursor, ts_value, inc_value, base + i)
        remaining = producer.flush(FLUSH_S)
        if remaining or errors:
            # the cursor stays where it was: the batch is read and sent again (duplicates only)
            reason = str(errors[0]) if errors else f"{remaining} events not acknowledged within {FLUSH_S} s"
            fatal = any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors)
            message = f"{table.config.key}: Kafka did not acknowledge the batch ({reason}); the cursor did not move"
            raise FatalError(message) if fatal else RetriableError(message)
        return next_cursor, ops

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
        self, table: PolledTable, op: str, values: tuple[Any, ...], position: int, clock_ns: int,
        ts_value: str | None, inc_value: Any,
    ) -> list[tuple[bytes, bytes | None]]:  # fmt: skip
        texts = tuple(pg_text(v, m.decode) for v, m in zip(values, table.mapped, strict=True))
        try:
            image = self.codec.row(table.shape, texts)
            key = self.codec.key_bytes(table.shape, self.codec.key_row(table.shape, texts))
        except ValueError as exc:
            raise FatalError(f"{table.config.key}: {exc}") from None
        now_us = time.time_ns() // 1000
        payload = {
            "before": image if op == "d" else None,
            "after": None if op == "d" else image,
            "source": self._source_block(table, position, clock_ns, ts_value, inc_value),
            "transaction": None,
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
        }
        records: list[tuple[bytes, bytes | None]] = [(key, orjson.dumps(payload))]
        if op == "d":
            records.append((key, None))  # tombstone: compaction may drop the row's events
        return records

    def _source_block(
        self, table: PolledTable, position: int, clock_ns: int, ts_value: str | None, inc_value: Any
    ) -> dict[str, Any]:
        poll_us = clock_ns // 1000
        cursor: dict[str, Any] = {}
        if ts_value is not None:
            cursor["timestamp"] = ts_value
        if inc_value is not None:
            cursor["incrementing"] = int(inc_value)
        return {
            "version": CONNECTOR_VERSION, "connector": "jdbc", "name": self.endpoint.server_name,
            "ts_ms": poll_us // 1000, "snapshot": "false", "db": table.shape.schema,
            "sequence": f'["{position}","{position}"]', "ts_us": poll_us, "ts_ns": clock_ns,
            "schema": table.shape.schema, "table": table.shape.table, "txId": None, "lsn": position, "xmin": None,
            "mode": table.poll.mode, "cursor": cursor,
        }  # fmt: skip

    def _commit_cursor(self, producer: Producer, table: PolledTable, cursor: TableCursor) -> None:
        """Store the cursor; only after Kafka acknowledged it is the batch done."""
        errors: list[KafkaError] = []
        self._produce_cursor(producer, table, cursor, False, errors)
        self._await_cursors(producer, errors, table.config.key)

    def _commit_cursors(self, producer: Producer, tables: list[PolledTable], stopped: bool = False) -> None:
        """Every table's cursor as it stands, acknowledged together (one flush, not one a
        table: a source of 200 tables starts and stops in one round trip)."""
        errors: list[KafkaError] = []
        for table in tables:
            self._produce_cursor(producer, table, table.cursor, stopped, errors)
        self._await_cursors(producer, errors, f"{len(tables)} tables" if len(tables) != 1 else tables[0].config.key)

    def _produce_cursor(
        self, producer: Producer, table: PolledTable, cursor: TableCursor, stopped: bool, errors: list[KafkaError]
    ) -> None:
        cursor.committed_at = datetime.now(UTC).isoformat()
        key = cursor_key(self.endpoint.name, table.config.key)
        record = replace(cursor, stopped=stopped).to_bytes()
        _produce(producer, self.endpoint.offsets_topic, key, record, _collect(errors))

    def _await_cursors(self, producer: Producer, errors: list[KafkaError], tables: str) -> None:
        if producer.flush(FLUSH_S) or errors:
            raise RetriableError(
                f"{tables}: storing the cursor in {self.endpoint.offsets_topic} failed "
                f"({errors[0] if errors else f'not acknowledged within {FLUSH_S} s'}); the batch will be re-sent"
            )

    def _report(self) -> None:
        status_file = self.settings.status_file
        if status_file is None:
            return
        status_file.parent.mkdir(parents=True, exist_ok=True)
        status = {**self.stats.as_dict(), "updated_at": datetime.now(UTC).isoformat()}
        tmp = status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=2))
        tmp.replace(status_file)


def _pgtype(oid: int) -> Any:
    pgtype = builtin_type(oid)
    assert pgtype is not None  # the mapping only lands on built-in types
    return pgtype


def check_poll_columns(table: TableConfig, described: SourceTable) -> None:
    """The poll block's columns exist and have usable types."""
    assert table.poll is not None
    poll, where = table.poll, f"tables[{table.key}].poll"
    kinds = {c.name: _pgtype(c.type_oid).kind for c in described.columns}
    if poll.incrementing_column is not None and kinds.get(poll.incrementing_column) not in INTEGER_KINDS:
        raise SourceTableError(
            f"{where}.incrementing_column: '{poll.incrementing_column}' is "
            f"{'not a column' if poll.incrementing_column not in kinds else 'not an integer column'} of "
            f"{table.key}; name a strictly increasing integer column (e.g. an AUTO_INCREMENT id)"
        )
    if poll.timestamp_column is not None and kinds.get(poll.timestamp_column) not in TIMESTAMP_KINDS:
        raise SourceTableError(
            f"{where}.timestamp_column: '{poll.timestamp_column}' is "
            f"{'not a column' if poll.timestamp_column not in kinds else 'not a datetime/timestamp column'} of "
            f"{table.key}; name a column set on every insert and update "
            "(updated_at DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6))"
        )
    if poll.soft_delete_column is not None and poll.soft_delete_column not in kinds:
        raise SourceTableError(
            f"{where}.soft_delete_column: '{poll.soft_delete_column}' is not a column of {table.key}"
        )


def advance_cursor(cursor: TableCursor, ts_value: str | None, inc_value: Any, position: int) -> None:
    cursor.timestamp = ts_value if ts_value is not None else cursor.timestamp
    cursor.incrementing = int(inc_value) if inc_value is not None else cursor.incrementing
    if inc_value is not None:
        cursor.max_incrementing = max(cursor.max_incrementing or int(inc_value), int(inc_value))
    cursor.position = position


def _collect(errors: list[KafkaError]) -> Callable[[KafkaError | None, Message], None]:
    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    return delivered


def _produce(producer: Producer, topic: str, key: bytes, value: bytes | None, callback: Any) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=callback)
            return
        except BufferError:  # the local queue is full: let deliveries drain
            producer.poll(0.5)


def query_batch(conn: Any, table: PolledTable, limit: int) -> tuple[list[tuple[Any, ...]], bool]:
    """The next batch after the cursor, in cursor order (each row ends with the cursor's
    timestamp text and incrementing value), and whether it was full."""
    poll, cursor = table.poll, table.cursor
    # every statement runs with parameters, so a literal % is written %%
    select = ", ".join(m.select_sql for m in table.mapped).replace("%", "%%")
    ts_col = quote_mysql(poll.timestamp_column) if poll.timestamp_column else None
    inc_col = quote_mysql(poll.incrementing_column) if poll.incrementing_column else None
    ts_text = f"DATE_FORMAT({ts_col}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')" if ts_col else "NULL"
    source = f"{quote_mysql(table.shape.schema)}.{quote_mysql(table.shape.table)}"
    head = f"SELECT {select}, {ts_text}, {inc_col or 'NULL'} FROM {source}"
    base = _base_conditions(poll, ts_col)
    after, params, order = _after_cursor(poll, cursor, ts_col, inc_col)
    conditions = base + after
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    with conn.cursor() as cur:
        cur.execute(f"{head}{where} ORDER BY {order} LIMIT {limit}", params)
        rows = list(cur.fetchall())
        full = len(rows) == limit
        if full and poll.mode == "timestamp":
            # the next query starts after the last timestamp: read every row that shares it
            last = rows[-1][-2]
            rows = [r for r in rows if r[-2] != last]
            cur.execute(f"{head} WHERE {' AND '.join([*base, f'{ts_col} = %s'])} ORDER BY {order}", [last])
            rows += list(cur.fetchall())
    return rows, full


def _base_conditions(poll: PollConfig, ts_col: str | None) -> list[str]:
    if ts_col is None:
        return []
    conditions = [f"{ts_col} IS NOT NULL"]
    if poll.timestamp_delay_s > 0:
        conditions.append(f"{ts_col} < NOW(6) - INTERVAL {int(poll.timestamp_delay_s * 1_000_000)} MICROSECOND")
    return conditions


def _after_cursor(
    poll: PollConfig, cursor: TableCursor, ts_col: str | None, inc_col: str | None
) -> tuple[list[str], list[Any], str]:
    """(conditions past the cursor, their parameters, the ORDER BY) for the poll mode."""
    if poll.mode == "incrementing":
        if cursor.incrementing is None:
            return [], [], f"{inc_col}"
        return [f"{inc_col} > %s"], [cursor.incrementing], f"{inc_col}"
    if poll.mode == "timestamp":
        if cursor.timestamp is None:
            return [], [], f"{ts_col}"
        return [f"{ts_col} > %s"], [cursor.timestamp], f"{ts_col}"
    order = f"{ts_col}, {inc_col}"
    if cursor.timestamp is None:
        return [], [], order
    condition = f"({ts_col} > %s OR ({ts_col} = %s AND {inc_col} > %s))"
    return [condition], [cursor.timestamp, cursor.timestamp, cursor.incrementing or 0], order


def start_at_latest(conn: Any, table: PolledTable) -> None:
    poll, cursor = table.poll, table.cursor
    source = f"{quote_mysql(table.shape.schema)}.{quote_mysql(table.shape.table)}"
    parts = []
    if poll.timestamp_column:
        parts.append(f"DATE_FORMAT(MAX({quote_mysql(poll.timestamp_column)}), '%%Y-%%m-%%d %%H:%%i:%%s.%%f')")
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
