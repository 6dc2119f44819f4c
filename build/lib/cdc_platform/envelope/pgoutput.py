"""Decoder for PostgreSQL's built-in logical replication output plugin, ``pgoutput``
(protocol version 1: Begin, Commit, Origin, Relation, Type, Insert, Update, Delete,
Truncate). Values arrive in text format; ``pgtypes`` converts them.

Reference: PostgreSQL docs, "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class UnchangedToast:
    """An unchanged TOASTed value: pgoutput does not resend it (tuple kind 'u')."""

    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = UnchangedToast()
# A tuple column: None (SQL NULL), the text representation, or UNCHANGED_TOAST.
TupleValue = str | None | UnchangedToast


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # the transaction's commit LSN
    commit_time: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # end of the commit record: what the slot's flush position moves to
    commit_time: datetime


@dataclass(frozen=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    part_of_key: bool


@dataclass(frozen=True)
class Relation:
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # d (default) | n (nothing) | f (full) | i (index)
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True)
class TypeMessage:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Insert:
    relation_id: int
    new: tuple[TupleValue, ...]


@dataclass(frozen=True)
class Update:
    relation_id: int
    old: tuple[TupleValue, ...] | None
    old_kind: str | None  # 'K' (old key only, the key changed) | 'O' (whole old row, identity FULL)
    new: tuple[TupleValue, ...]


@dataclass(frozen=True)
class Delete:
    relation_id: int
    old: tuple[TupleValue, ...]
    old_kind: str  # 'K' | 'O'


@dataclass(frozen=True)
class Truncate:
    options: int  # bit 1: CASCADE, bit 2: RESTART IDENTITY
    relation_ids: tuple[int, ...]


Message = Begin | Commit | Origin | Relation | TypeMessage | Insert | Update | Delete | Truncate


class PgOutputError(ValueError):
    pass


_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise PgOutputError(f"message truncated at byte {self.pos} (wanted {n} more of {len(self.data)})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        return int(struct.unpack("!h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack("!i", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack("!I", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack("!q", self.take(8))[0])

    def uint64(self) -> int:
        return int(struct.unpack("!Q", self.take(8))[0])

    def cstring(self) -> str:
        end = self.data.index(b"\0", self.pos)
        text = self.data[self.pos : end].decode()
        self.pos = end + 1
        return text

    def timestamp(self) -> datetime:
        return PG_EPOCH + timedelta(microseconds=self.int64())

    def tuple_data(self) -> tuple[TupleValue, ...]:
        # the hot path of capture: one tight loop over the bytes, no per-field method calls
        data, pos = self.data, self.pos
        try:
            (count,) = _INT16.unpack_from(data, pos)
            pos += 2
            values: list[TupleValue] = []
            append = values.append
            for _ in range(count):
                kind = data[pos]
                pos += 1
                if kind == 116:  # 't': text
                    (length,) = _INT32.unpack_from(data, pos)
                    pos += 4
                    end = pos + length
                    if end > len(data):
                        raise PgOutputError(f"message truncated at byte {pos} (wanted {length} more of {len(data)})")
                    append(data[pos:end].decode())
                    pos = end
                elif kind == 110:  # 'n': null
                    append(None)
                elif kind == 117:  # 'u': unchanged TOAST
                    append(UNCHANGED_TOAST)
                else:
                    raise PgOutputError(f"unknown tuple column kind {chr(kind)!r} (binary mode is not requested)")
        except (struct.error, IndexError):
            raise PgOutputError(f"message truncated at byte {pos} of {len(data)}") from None
        self.pos = pos
        return tuple(values)


def decode(payload: bytes) -> Message:
    """Decode one pgoutput message (the payload of an XLogData message)."""
    if not payload:
        raise PgOutputError("empty message")
    r = _Reader(payload)
    tag = chr(r.int8())
    if tag == "B":
        return Begin(final_lsn=r.uint64(), commit_time=r.timestamp(), xid=r.uint32())
    if tag == "C":
        return Commit(flags=r.int8(), commit_lsn=r.uint64(), end_lsn=r.uint64(), commit_time=r.timestamp())
    if tag == "O":
        return Origin(lsn=r.uint64(), name=r.cstring())
    if tag == "R":
        relation_id, namespace, name, identity = r.uint32(), r.cstring(), r.cstring(), chr(r.int8())
        columns = []
        for _ in range(r.int16()):
            flags, col_name, type_oid, typmod = r.int8(), r.cstring(), r.uint32(), r.int32()
            columns.append(RelationColumn(col_name, type_oid, typmod, bool(flags & 1)))
        return Relation(relation_id, namespace, name, identity, tuple(columns))
    if tag == "Y":
        return TypeMessage(type_oid=r.uint32(), namespace=r.cstring(), name=r.cstring())
    if tag == "I":
        relation_id = r.uint32()
        _expect(r, "N")
        return Insert(relation_id, r.tuple_data())
    if tag == "U":
        relation_id = r.uint32()
        kind = chr(r.int8())
        old: tuple[TupleValue, ...] | None = None
        old_kind: str | None = None
        if kind in ("K", "O"):
            old, old_kind = r.tuple_data(), kind
            kind = chr(r.int8())
        if kind != "N":
            raise PgOutputError(f"update message: expected 'N', got {kind!r}")
        return Update(relation_id, old, old_kind, r.tuple_data())
    if tag == "D":
        relation_id = r.uint32()
        kind = chr(r.int8())
        if kind not in ("K", "O"):
            raise PgOutputError(f"delete message: expected 'K' or 'O', got {kind!r}")
        return Delete(relation_id, r.tuple_data(), kind)
    if tag == "T":
        count, options = r.int32(), r.int8()
        return Truncate(options, tuple(r.uint32() for _ in range(count)))
    raise PgOutputError(f"unsupported pgoutput message {tag!r}")


def _expect(r: _Reader, tag: str) -> None:
    got = chr(r.int8())
    if got != tag:
        raise PgOutputError(f"expected {tag!r}, got {got!r}")
