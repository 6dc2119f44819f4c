"""What a PostgreSQL table looks like: columns, key, replica identity, size, types.

Read from the catalog with the platform's own (least-privilege) role. Helpers take an
open connection and plain values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from cdc_platform.envelope.pgtypes import PgType, builtin_type
from cdc_platform.model.errors import SourceTableError
from cdc_platform.model.tables import (
    LakeColumn,
    SourceColumn,
    SourceTable,
    TableSchema,
    refuse_key_the_lake_merges,
    resolve_key,
)

Connection = psycopg.Connection[tuple[Any, ...]]

_REPLICA_IDENTITY = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


def describe_table(conn: Connection, schema: str, table: str) -> SourceTable:
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
    return SourceTable(
        schema=schema,
        name=table,
        columns=_columns(conn, int(oid)),
        primary_key=_primary_key(conn, int(oid)),
        replica_identity=_REPLICA_IDENTITY.get(str(replident), str(replident)),
        estimated_rows=int(str(estimated)),
    )


def _columns(conn: Connection, oid: int) -> tuple[SourceColumn, ...]:
    rows = conn.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef, a.attnum,
                  a.atttypid, a.atttypmod, a.attndims
           FROM pg_attribute a
           WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum""",
        (oid,),
    ).fetchall()
    return tuple(
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
        for name, type_name, notnull, has_default, ordinal, type_oid, typmod, dims in rows
    )


def _primary_key(conn: Connection, oid: int) -> tuple[str, ...]:
    rows = conn.execute(
        """SELECT a.attname
           FROM pg_index i
           CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE i.indrelid = %s AND i.indisprimary
           ORDER BY k.pos""",
        (oid,),
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def table_schema(described: SourceTable, types: dict[int, PgType], key: tuple[str, ...]) -> TableSchema:
    """The resolved schema the lake uses (compatibility compares PostgreSQL's own type names)."""
    return TableSchema(
        tuple(
            LakeColumn(c.name, types[c.type_oid], c.type_modifier, c.dims, c.nullable, c.has_default, c.type_name)
            for c in described.columns
        ),
        key,
    )


def keyed_schema(conn: Connection, described: SourceTable, configured_key: list[str] | None,
                 config_field: str) -> TableSchema:  # fmt: skip
    """The resolved schema with the table's key (``resolve_key``), refusing a key the lake
    would merge (``key_columns_the_lake_merges``)."""
    key = resolve_key(described, configured_key, config_field)
    schema = table_schema(described, resolve_pg_types(conn, [c.type_oid for c in described.columns]), key)
    fix = (
        "key it on columns the lake keeps apart: a primary key without them (an identity column, say), "
        f"or on a table without a primary key other columns in {config_field}"
    )
    refuse_key_the_lake_merges(described, key_columns_the_lake_merges(schema), fix)
    return schema


def key_columns_the_lake_merges(schema: TableSchema) -> dict[str, str]:
    """Key columns whose lake value can stand for two PostgreSQL keys, with how: a timetz
    (under a domain or as an array's element too) is kept as its UTC time, the Debezium
    representation, which drops the zone the key's equality keeps."""
    return {
        c.name: "a time with time zone is kept as its UTC time, so '12:00+01' and '11:00+00', two keys to "
        "PostgreSQL, are one to the lake"
        for c in schema.columns
        if c.name in schema.key and _holds_timetz(c.pgtype)
    }


def _holds_timetz(pgtype: PgType) -> bool:
    return pgtype.kind == "timetz" or (pgtype.element is not None and _holds_timetz(pgtype.element))


def count_rows(conn: Connection, schema: str, table: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def rows_written(conn: Connection, schema: str, table: str) -> int:
    """Rows inserted + updated + deleted in the table as the statistics collector counts
    them (committed or not; reset with the statistics). 0 for a table it has not seen."""
    query = (
        "SELECT coalesce(n_tup_ins + n_tup_upd + n_tup_del, 0) FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = %s"
    )
    row = conn.execute(query, (schema, table)).fetchone()
    return int(row[0]) if row else 0


def resolve_pg_types(
    conn: Connection, oids: Iterable[int], known: dict[int, PgType] | None = None
) -> dict[int, PgType]:
    """PgType for each oid: built-ins from the table in pgtypes, the rest (enums, domains,
    arrays of them) from pg_type. ``known`` is a cache, updated in place."""
    types = known if known is not None else {}
    wanted = set(oids)
    for oid in wanted:
        builtin = builtin_type(oid)
        if builtin is not None:
            types[oid] = builtin
    unknown = sorted(o for o in wanted if o not in types)
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
    for row in rows:
        types[int(row[0])] = _catalog_type(conn, types, row)
    return types


def _catalog_type(conn: Connection, types: dict[int, PgType], row: tuple[Any, ...]) -> PgType:
    """One pg_type row (oid, name, typtype, typelem, typbasetype, typcategory, enum labels)."""
    raw_oid, raw_name, typtype, typelem, basetype, category, labels = row
    oid, name = int(raw_oid), str(raw_name)
    if typtype == "e":
        return PgType(oid, name, "enum", enum_values=tuple(labels))
    if typtype == "d":  # a domain behaves as its base type
        base = resolve_pg_types(conn, [int(basetype)], types)[int(basetype)]
        return PgType(oid, name, base.kind, base.element, base.enum_values)
    if category == "A" and int(typelem):
        element = resolve_pg_types(conn, [int(typelem)], types)[int(typelem)]
        return PgType(oid, name, "array", element=element)
    return PgType(oid, name, "text")
