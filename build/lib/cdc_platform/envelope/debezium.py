"""The Debezium-compatible change-event envelope (JSON, with or without ``schema``).

Value: ``{before, after, source{…}, op, ts_ms, ts_us, ts_ns, transaction}`` with ``op`` in
c/u/d/t (r for snapshot reads). Key: exactly the key columns, serialized the same way for
every event of a row, so log compaction works and the partitioner sends every event of a
row to one partition.

Deviations from Debezium, on purpose:
* ``source.sequence`` is ``["<commit LSN of this transaction>", "<LSN of the change>"]``
  (Debezium puts the *previous* commit LSN first). Both order events the same way; ours
  is a property of the transaction, identical when a transaction is re-sent after a crash.
* Unchanged TOASTed values: if the table has REPLICA IDENTITY FULL the value is taken
  from the old row image (exact). Otherwise PostgreSQL does not send it, and the field
  holds Debezium's placeholder ``__debezium_unavailable_value`` (base64 of it for bytea,
  ``[placeholder]`` for arrays) — the lake's merge treats the placeholder as "keep the
  current value", so it never lands as data.
* ``t`` (truncate) events are written to *every* partition of the topic, so each
  partition's consumer sees the truncate in its own order. Their key holds the key
  columns, all null (``{"id":null}``): compacted topics reject records without a key, and
  no row can have that key because key columns are never null. (Debezium skips truncates
  by default for the same reason; skipping them would let the lake keep deleted rows.)
"""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from cdc_platform.envelope.pgoutput import UNCHANGED_TOAST, TupleValue
from cdc_platform.envelope.pgtypes import (
    ConversionError,
    ConversionOptions,
    JsonValue,
    PgType,
    connect_schema,
    to_json_value,
)

UNAVAILABLE = "__debezium_unavailable_value"
CONNECTOR_VERSION = "cdc_platform-0.1.0"
Op = Literal["r", "c", "u", "d", "t"]


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    pgtype: PgType
    typmod: int
    nullable: bool


@dataclass(frozen=True)
class TableShape:
    """A captured table as the stream sees it (from the pgoutput Relation message)."""

    schema: str
    table: str
    columns: tuple[ColumnSpec, ...]
    key_columns: tuple[str, ...]
    full_identity: bool  # REPLICA IDENTITY FULL: whole old rows on update/delete
    topic: str

    def index_of(self, name: str) -> int:
        return next(i for i, c in enumerate(self.columns) if c.name == name)


@dataclass(frozen=True)
class SourcePosition:
    """Where an event came from in the source: its ordering position."""

    commit_lsn: int
    lsn: int
    tx_id: int | None
    commit_time: datetime
    snapshot: str = "false"  # true | last | false (Debezium's enum)


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    op: Op | None  # None for tombstones
    partition: int | None = None  # explicit only for truncates
    lsn: int = 0
    unconvertible: str | None = None  # why: capture's "this value has no representation" event


class EnvelopeCodec:
    """Builds key and value bytes for one source (Debezium ``topic.prefix`` = ``server_name``)."""

    def __init__(
        self,
        server_name: str,
        database: str,
        with_schema: bool = False,
        options: ConversionOptions | None = None,
    ) -> None:
        self.server_name = server_name
        self.database = database
        self.with_schema = with_schema
        self.options = options or ConversionOptions()
        self._schema_cache: dict[tuple[str, str, tuple[ColumnSpec, ...]], tuple[Any, Any]] = {}
        self._source_cache_key: tuple[str, str, int, str] | None = None
        self._source_cache: dict[str, Any] = {}

    # -- rows --------------------------------------------------------------------------
    def row(
        self, shape: TableShape, values: tuple[TupleValue, ...], old: tuple[TupleValue, ...] | None = None
    ) -> dict[str, Any]:
        if len(values) != len(shape.columns):
            raise ValueError(
                f"{shape.schema}.{shape.table}: tuple has {len(values)} columns, relation has {len(shape.columns)}"
            )
        out: dict[str, Any] = {}
        for i, (column, new_value) in enumerate(zip(shape.columns, values, strict=True)):
            value = new_value
            if value is UNCHANGED_TOAST:
                value = old[i] if old is not None and i < len(old) else UNCHANGED_TOAST
                if value is UNCHANGED_TOAST:
                    out[column.name] = self._placeholder(column)
                    continue
            assert value is None or isinstance(value, str)
            out[column.name] = _converted(value, column, self.options)
        return out

    def key_row(self, shape: TableShape, values: tuple[TupleValue, ...]) -> dict[str, Any]:
        """Key columns from a full row or from an old-key tuple (non-key columns null)."""
        result = {}
        for name in shape.key_columns:
            i = shape.index_of(name)
            value = values[i]
            if value is None or value is UNCHANGED_TOAST:
                raise ValueError(f"{shape.schema}.{shape.table}: key column {name} is missing from the row image")
            result[name] = _converted(value, shape.columns[i], self.options)  # type: ignore[arg-type]
        return result

    def _placeholder(self, column: ColumnSpec) -> Any:
        if column.pgtype.kind == "bytea":
            return base64.b64encode(UNAVAILABLE.encode()).decode()
        if column.pgtype.kind == "array":
            return [UNAVAILABLE]
        return UNAVAILABLE

    # -- records -------------------------------------------------------------------------
    def key_bytes(self, shape: TableShape, key: dict[str, Any]) -> bytes:
        if self.with_schema:
            _, key_schema = self._schemas(shape)
            return _dumps({"schema": key_schema, "payload": key})
        return _dumps(key)

    def value_bytes(
        self,
        shape: TableShape,
        op: Op,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        position: SourcePosition,
        now_us: int,
    ) -> bytes:
        payload = {
            "before": before,
            "after": after,
            "source": self.source_block(shape, position),
            "transaction": None,
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
        }
        if self.with_schema:
            value_schema, _ = self._schemas(shape)
            return _dumps({"schema": value_schema, "payload": payload})
        return _dumps(payload)

    def source_block(self, shape: TableShape, position: SourcePosition) -> dict[str, Any]:
        # one transaction's events share all but the position: build the rest once
        cache_key = (shape.schema, shape.table, position.commit_lsn, position.snapshot)
        if self._source_cache_key != cache_key:
            self._source_cache_key = cache_key
            self._source_cache = self._source_block(shape, position)
        block = dict(self._source_cache)
        block["sequence"] = f'["{position.commit_lsn}","{position.lsn}"]'
        block["lsn"] = position.lsn
        return block

    def _source_block(self, shape: TableShape, position: SourcePosition) -> dict[str, Any]:
        commit_us = int(position.commit_time.timestamp() * 1_000_000)
        return {
            "version": CONNECTOR_VERSION,
            "connector": "postgresql",
            "name": self.server_name,
            "ts_ms": commit_us // 1000,
            "snapshot": position.snapshot,
            "db": self.database,
            "sequence": None,  # per event: set by source_block
            "ts_us": commit_us,
            "ts_ns": commit_us * 1000,
            "schema": shape.schema,
            "table": shape.table,
            "txId": position.tx_id,
            "lsn": position.lsn,
            "xmin": None,
        }

    def change_records(
        self,
        shape: TableShape,
        op: Literal["c", "u", "d"],
        new: tuple[TupleValue, ...] | None,
        old: tuple[TupleValue, ...] | None,
        old_is_full_row: bool,
        position: SourcePosition,
        now_us: int,
    ) -> list[Record]:
        """Records for one row change: c → [c]; u → [u], or when the key changed
        [d(old), tombstone(old), c(new)]; d → [d, tombstone]."""
        records: list[Record] = []
        if op == "c":
            assert new is not None
            after = self.row(shape, new)
            key = self.key_bytes(shape, self.key_row(shape, new))
            records.append(self._record(shape, key, "c", None, after, position, now_us))
            return records
        if op == "d":
            assert old is not None
            deleted = self.row(shape, old) if old_is_full_row else self._key_only_row(shape, old)
            key = self.key_bytes(shape, self.key_row(shape, old))
            records.append(self._record(shape, key, "d", deleted, None, position, now_us))
            records.append(Record(shape.topic, key, None, None, lsn=position.lsn))
            return records
        assert new is not None
        after = self.row(shape, new, old if old_is_full_row else None)
        new_key = self.key_row(shape, new)
        old_key = self.key_row(shape, old) if old is not None else new_key
        before: dict[str, Any] | None = None
        if old is not None:
            before = self.row(shape, old) if old_is_full_row else self._key_only_row(shape, old)
        if old_key != new_key:
            old_key_bytes = self.key_bytes(shape, old_key)
            records.append(self._record(shape, old_key_bytes, "d", before, None, position, now_us))
            records.append(Record(shape.topic, old_key_bytes, None, None, lsn=position.lsn))
            records.append(self._record(shape, self.key_bytes(shape, new_key), "c", None, after, position, now_us))
            return records
        records.append(
            self._record(
                shape, self.key_bytes(shape, new_key), "u", before if old_is_full_row else None, after, position, now_us
            )
        )
        return records

    def unconvertible_record(
        self, shape: TableShape, op: Op, values: tuple[TupleValue, ...] | None, position: SourcePosition,
        now_us: int, error: ConversionError,
    ) -> Record:  # fmt: skip
        """For a change whose value has no representation (``change_records`` raised
        ``error``): one event in the table's topic saying which, so the source's other
        tables keep streaming and the lake dead-letters it or stops this table, per its
        ``errors.tolerance``. Not a change event (no ``op``): Debezium consumers skip it,
        the platform's changelog reads ``cdc_unconvertible``. Keyed like the row's other events when the
        key itself converts, so it sits in the same partition, in order."""
        key: bytes | None = None
        if values is not None:
            with contextlib.suppress(ConversionError, ValueError):
                key = self.key_bytes(shape, self.key_row(shape, values))
        problem = {
            "table": f"{shape.schema}.{shape.table}", "column": error.column, "op": op,
            "text": None if error.text is None else error.text[:200], "reason": str(error),
        }  # fmt: skip
        value = {"cdc_unconvertible": problem, "source": self.source_block(shape, position), "op": None,
                 "ts_ms": now_us // 1000}  # fmt: skip
        return Record(shape.topic, key, _dumps(value), None, lsn=position.lsn, unconvertible=str(error))

    def truncate_records(
        self, shape: TableShape, position: SourcePosition, now_us: int, partitions: int
    ) -> list[Record]:
        value = self.value_bytes(shape, "t", None, None, position, now_us)
        key = self.key_bytes(shape, dict.fromkeys(shape.key_columns))
        return [Record(shape.topic, key, value, "t", partition=p, lsn=position.lsn) for p in range(partitions)]

    def _key_only_row(self, shape: TableShape, old: tuple[TupleValue, ...]) -> dict[str, Any]:
        key = self.key_row(shape, old)
        return {c.name: key.get(c.name) for c in shape.columns}

    def _record(
        self,
        shape: TableShape,
        key: bytes,
        op: Op,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        position: SourcePosition,
        now_us: int,
    ) -> Record:
        return Record(
            shape.topic, key, self.value_bytes(shape, op, before, after, position, now_us), op, lsn=position.lsn
        )

    # -- schemas -------------------------------------------------------------------------
    def _schemas(self, shape: TableShape) -> tuple[Any, Any]:
        cache_key = (shape.schema, shape.table, shape.columns)
        if cache_key not in self._schema_cache:
            self._schema_cache[cache_key] = (self._value_schema(shape), self._key_schema(shape))
        return self._schema_cache[cache_key]

    def _field(self, column: ColumnSpec, optional: bool) -> dict[str, Any]:
        return {
            **connect_schema(column.pgtype, column.typmod, self.options),
            "optional": optional,
            "field": column.name,
        }

    def _key_schema(self, shape: TableShape) -> dict[str, Any]:
        columns = {c.name: c for c in shape.columns}
        return {
            "type": "struct",
            "fields": [self._field(columns[name], False) for name in shape.key_columns],
            "optional": False,
            "name": f"{self.server_name}.{shape.schema}.{shape.table}.Key",
        }

    def _value_schema(self, shape: TableShape) -> dict[str, Any]:
        # Without whole old rows, 'before' of a delete holds only the key; the other fields
        # must then be optional for the record to match its schema.
        row_fields = [
            self._field(c, optional=(c.nullable or not shape.full_identity) and c.name not in shape.key_columns)
            for c in shape.columns
        ]
        row_name = f"{self.server_name}.{shape.schema}.{shape.table}.Value"
        row = {"type": "struct", "fields": row_fields, "optional": True, "name": row_name}
        return {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                {**SOURCE_SCHEMA, "field": "source"},
                {**TRANSACTION_SCHEMA, "field": "transaction"},
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
            "optional": False,
            "name": f"{self.server_name}.{shape.schema}.{shape.table}.Envelope",
            "version": 2,
        }


def _s(field: str, type_: str = "string", optional: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "optional": optional, **extra, "field": field}


SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _s("version"),
        _s("connector"),
        _s("name"),
        _s("ts_ms", "int64"),
        _s(
            "snapshot",
            optional=True,
            name="io.debezium.data.Enum",
            version=1,
            parameters={
                "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
            },
            default="false",
        ),
        _s("db"),
        _s("sequence", optional=True),
        _s("ts_us", "int64", optional=True),
        _s("ts_ns", "int64", optional=True),
        _s("schema"),
        _s("table"),
        _s("txId", "int64", optional=True),
        _s("lsn", "int64", optional=True),
        _s("xmin", "int64", optional=True),
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "version": 1,
}

TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_s("id"), _s("total_order", "int64"), _s("data_collection_order", "int64")],
    "optional": True,
    "name": "event.block",
    "version": 1,
}


def _converted(text: str | None, column: ColumnSpec, options: ConversionOptions) -> JsonValue:
    try:
        return to_json_value(text, column.pgtype, column.typmod, options)
    except ConversionError as exc:
        raise ConversionError(f"column {column.name}: {exc}", column.name, text) from None


def _dumps(obj: Any) -> bytes:
    # compact and deterministic (insertion order, no spaces, UTF-8): the same row always
    # serializes to the same key bytes; orjson is the measured hot spot's fix (bench/)
    return orjson.dumps(obj)
