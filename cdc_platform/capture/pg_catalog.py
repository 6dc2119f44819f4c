"""What a PostgreSQL table looks like: columns, key, replica identity, size.

Read from the catalog with the platform's own (least-privilege) role. Used by capture to
build keys, by snapshots to split reads, and by the schema checks and the Dagster UI.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from cdc_platform.envelope.pgtypes import PgType, builtin_type


class SourceTableError(RuntimeError):
    """The table is missing or cannot be captured as configured; the message names the fix."""


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type_name: str  # format_type(), e.g. "numeric(12,2)", "timestamp with time zone", "text[]"
    nullable: bool
    has_default: bool
    ordinal: int
    type_oid: int = 0
    type_modifier: int = -1
    dims: int = 1  # declared array dimensions (integer[][] -> 2)


@dataclass(frozen=True)
class SourceTable:
    schema: str
    name: str
    columns: tuple[SourceColumn, ...]
    primary_key: tuple[str, ...]  # empty when the table has none
    replica_identity: str  # default | full | index | nothing
    estimated_rows: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        """The name as SQL needs it in a suggested fix ("Order Items" stays quoted)."""
        return ".".join('"' + part.replace('"', '""') + '"' for part in (self.schema, self.name))

    def schema_hash(self) -> str:
        """Stable hash of the column list (names, types, nullability) and key."""
        payload = json.dumps(
            {
                "columns": [(c.name, c.type_name, c.nullable) for c in self.columns],
                "primary_key": list(self.primary_key),
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_REPLICA_IDENTITY = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


def describe_table(conn: psycopg.Connection[tuple[object, ...]], schema: str, table: str) -> SourceTable:
    row = conn.execute(
        """SELECT c.oid, c.relreplident, greatest(c.reltuples, 0)::bigint
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')""",
        (schema, table),
    ).fetchone()
    if row is None:
        raise SourceTableError(
            f'table {schema}.{table} does not exist in database "{conn.info.dbname}" (or the role '
            f"{conn.info.user} cannot see it); fix the name in the config or create the table"
        )
    oid, replident, estimated = row
    columns = tuple(
        SourceColumn(
            name=str(name),
            type_name=str(type_name),
            nullable=not bool(notnull),
            has_default=bool(has_default),
            ordinal=int(str(ordinal)),
            type_oid=int(str(type_oid)),
            type_modifier=int(str(typmod)),
            dims=max(int(str(dims)), 1),
        )
        for name, type_name, notnull, has_default, ordinal, type_oid, typmod, dims in conn.execute(
            """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef, a.attnum,
                      a.atttypid, a.atttypmod, a.attndims
               FROM pg_attribute a
               WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
               ORDER BY a.attnum""",
            (oid,),
        ).fetchall()
    )
    primary_key = tuple(
        str(r[0])
        for r in conn.execute(
            """SELECT a.attname
               FROM pg_index i
               CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = %s AND i.indisprimary
               ORDER BY k.pos""",
            (oid,),
        ).fetchall()
    )
    return SourceTable(
        schema=schema,
        name=table,
        columns=columns,
        primary_key=primary_key,
        replica_identity=_REPLICA_IDENTITY.get(str(replident), str(replident)),
        estimated_rows=int(str(estimated)),
    )


def resolve_key(source_table: SourceTable, configured: list[str] | None, config_field: str) -> tuple[str, ...]:
    """The columns that key the table's events.

    The table's primary key, unless the config names one. A table without a primary key
    is refused unless the config names a key, and then it needs REPLICA IDENTITY FULL so
    updates and deletes carry the whole old row.
    """
    names = {c.name for c in source_table.columns}
    if configured:
        unknown = [c for c in configured if c not in names]
        if unknown:
            raise SourceTableError(
                f"{config_field} names column(s) {unknown} that {source_table.qualified} does not have "
                f"(columns: {', '.join(sorted(names))})"
            )
        if source_table.primary_key and tuple(configured) != source_table.primary_key:
            raise SourceTableError(
                f"{config_field} is {configured} but {source_table.qualified} has primary key "
                f"{list(source_table.primary_key)}; remove primary_key from the config or make them equal"
            )
        if not source_table.primary_key and source_table.replica_identity != "full":
            raise SourceTableError(
                f"{source_table.qualified} has no primary key, so a configured key needs whole old rows: "
                f"run ALTER TABLE {source_table.sql_name} REPLICA IDENTITY FULL"
            )
        return tuple(configured)
    if not source_table.primary_key:
        raise SourceTableError(
            f"{source_table.qualified} has no primary key; add one, or name key columns in "
            f"{config_field} (and ALTER TABLE {source_table.sql_name} REPLICA IDENTITY FULL)"
        )
    return source_table.primary_key


def slot_position(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> dict[str, object] | None:
    """A replication slot as PostgreSQL sees it; None if it does not exist."""
    row = conn.execute(
        """SELECT confirmed_flush_lsn::text, wal_status, active,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
           FROM pg_replication_slots WHERE slot_name = %s""",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    confirmed, wal_status, active, lag_bytes = row
    return {
        "confirmed_flush_lsn": str(confirmed),
        "wal_status": str(wal_status),
        "active": bool(active),
        "lag_bytes": int(str(lag_bytes or 0)),
    }


def resolve_pg_types(
    conn: psycopg.Connection[tuple[Any, ...]], oids: Iterable[int], known: dict[int, PgType] | None = None
) -> dict[int, PgType]:
    """PgType for each oid: built-ins from the table in pgtypes, the rest (enums, domains,
    arrays of them) from pg_type. ``known`` is a cache, updated in place."""
    types = known if known is not None else {}
    wanted = set(oids)
    unknown = sorted(o for o in wanted if o not in types and builtin_type(o) is None)
    for oid in wanted:
        builtin = builtin_type(oid)
        if builtin is not None:
            types[oid] = builtin
    if not unknown:
        return types
    rows = conn.execute(
        """SELECT t.oid, t.typname, t.typtype, t.typelem, t.typbasetype, t.typcategory,
                  coalesce(array_agg(e.enumlabel ORDER BY e.enumsortorder)
                           FILTER (WHERE e.enumlabel IS NOT NULL), '{}')
           FROM pg_type t LEFT JOIN pg_enum e ON e.enumtypid = t.oid
           WHERE t.oid = ANY(%s) GROUP BY t.oid""",
        (unknown,),
    ).fetchall()
    for raw_oid, name, typtype, typelem, basetype, category, labels in rows:
        oid = int(raw_oid)
        if typtype == "e":
            types[oid] = PgType(oid, str(name), "enum", enum_values=tuple(labels))
        elif typtype == "d":  # a domain behaves as its base type
            base = resolve_pg_types(conn, [int(basetype)], types)[int(basetype)]
            types[oid] = PgType(oid, str(name), base.kind, base.element, base.enum_values)
        elif category == "A" and int(typelem):
            element = resolve_pg_types(conn, [int(typelem)], types)[int(typelem)]
            types[oid] = PgType(oid, str(name), "array", element=element)
        else:
            types[oid] = PgType(oid, str(name), "text")
    return types
