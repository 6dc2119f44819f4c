"""A PostgreSQL table split into key-range chunks of about the same number of rows.

Why key ranges, not CTID block ranges: a generation read chunk by chunk in short
transactions (the incremental mode) needs every row in exactly one chunk *whatever happens
between two chunks' reads*. An UPDATE writes a new row version, often in another block, so
a row can leave a CTID range not yet read for one already read and be missed (its update
event then lacks the TOASTed values the snapshot should have held). A row never leaves its
key's range: an UPDATE of the key is a delete and an insert, both in the log the apply
replays. Key ranges also take a key of any type (composite, uuid, text, enum) and any
skew: the boundaries are every n-th key in key order (``row_number()`` over the key's
index), not arithmetic on key values, so each chunk holds n rows as the table stood when
the plan was made.

How the boundaries are found depends on the mode. A generation read from one exported
snapshot (``plan_chunks``) numbers the keys with ``row_number()`` in that snapshot: exact
runs of one state. An incremental generation (``walk_chunks``) holds no snapshot longer
than a chunk's read, so it walks the key's index instead: each boundary is one short
statement (``ORDER BY key OFFSET step - 1 LIMIT 1`` after the last one, in a transaction
of its own). At 10M rows ``row_number()`` held one snapshot for the whole plan (2.8 s,
longer than any chunk's read); a step holds one for its ``step`` index entries.

The boundaries are read as PostgreSQL literals (``quote_literal(key::text)``) and compared
as untyped literals, which PostgreSQL resolves to the column's own type: no cast that could
lose a typmod (``char(n)``, ``bit(n)``), and the same ordering (collation, enum order) as
the ``ORDER BY`` that chose them. The planning session and the readers share
``snapshot.SESSION_SQL`` (UTC), so timestamps' text forms mean the same instant on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc_platform.model.chunks import chunk_count, chunk_predicates

ROW_NUMBER = "_cdc_chunk_row"


def boundaries_query(schema: str, table: str, key: Sequence[str], chunks: int, rows: int) -> sql.Composed:
    """The last key of each of ``chunks`` runs of equal length (±1 row) in key order, but
    the last run's (the last chunk is open-ended), each column as a PostgreSQL literal.
    Row ``rn`` ends a run when ``rn * chunks / rows`` passes a whole number there."""
    keys, literals, not_null = _key_list(key), _key_literals(key), _not_null(key)
    return sql.SQL(
        "SELECT {literals} FROM (SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS {rn} FROM {schema}.{table} "
        "WHERE {not_null}) AS ordered "
        "WHERE {rn} < {rows} AND ({rn} * {chunks}) / {rows} > (({rn} - 1) * {chunks}) / {rows} ORDER BY {rn}"
    ).format(
        literals=literals, keys=keys, rn=sql.Identifier(ROW_NUMBER), schema=sql.Identifier(schema),
        table=sql.Identifier(table), not_null=not_null, chunks=sql.Literal(chunks), rows=sql.Literal(rows),
    )  # fmt: skip


def plan_chunks(
    conn: psycopg.Connection[tuple[Any, ...]], schema: str, table: str, key: Sequence[str], key_nullable: bool,
    rows: int, chunk_rows: int,
) -> list[str]:  # fmt: skip
    """The table's chunks as WHERE clauses (one Spark task each); one chunk for a table of
    at most ``chunk_rows`` rows. ``rows``: the table's row count in the same transaction."""
    if rows <= chunk_rows:
        return ["TRUE"]
    query = boundaries_query(schema, table, key, chunk_count(rows, chunk_rows), rows)
    boundaries = [tuple(str(v) for v in row) for row in conn.execute(query)]
    return chunk_predicates(key, boundaries, key_nullable, sql_ident)


def sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def walk_chunks(
    conn: psycopg.Connection[tuple[Any, ...]], schema: str, table: str, key: Sequence[str], key_nullable: bool,
    estimated_rows: int, chunk_rows: int,
) -> tuple[int, list[str]]:  # fmt: skip
    """The table's chunks (WHERE clauses) found by walking its key, each step in a statement
    of its own on an autocommit ``conn``, and the rows walked (plus NULL keys). Runs are
    equal when ``estimated_rows`` is right (``pg_class``; 0: counted first, in a statement
    of its own); a wrong estimate only changes how many there are: each holds at most
    ``chunk_rows`` rows, but the last, which takes a remainder under half a run."""
    rows = estimated_rows if estimated_rows > 0 else _count(conn, schema, table, _not_null(key))
    step = -(-max(1, rows) // chunk_count(rows, chunk_rows))  # runs of equal length, none above chunk_rows
    boundaries: list[tuple[str, ...]] = []
    while (found := conn.execute(_step_query(schema, table, key, boundaries[-1:], step)).fetchone()) is not None:
        boundaries.append(tuple(str(v) for v in found))
    remainder = _count(conn, schema, table, _after(key, boundaries[-1:]), limit=step)
    walked = len(boundaries) * step + remainder
    if boundaries and remainder * 2 < step:
        boundaries.pop()  # a short last run joins the one before it (at most 1.5 runs)
    if key_nullable:
        nulls = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in key)
        walked += _count(conn, schema, table, nulls)
    return walked, chunk_predicates(key, boundaries, key_nullable, sql_ident)


def _step_query(schema: str, table: str, key: Sequence[str], after: Sequence[Sequence[str]], step: int) -> sql.Composed:
    """The key ``step`` rows on from ``after`` (from the first key when empty), as literals."""
    keys, literals = _key_list(key), _key_literals(key)
    query = "SELECT {literals} FROM {schema}.{table} WHERE {where} ORDER BY {keys} OFFSET {skip} LIMIT 1"
    return sql.SQL(query).format(
        literals=literals, schema=sql.Identifier(schema), table=sql.Identifier(table), where=_after(key, after),
        keys=keys, skip=sql.Literal(step - 1),
    )  # fmt: skip


def _key_list(key: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(k) for k in key)


def _key_literals(key: Sequence[str]) -> sql.Composable:
    """Each key column as a PostgreSQL literal of its text form."""
    return sql.SQL(", ").join(sql.SQL("quote_literal({}::text)").format(sql.Identifier(k)) for k in key)


def _not_null(key: Sequence[str]) -> sql.Composable:
    return sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in key)


def _after(key: Sequence[str], after: Sequence[Sequence[str]]) -> sql.Composable:
    """Keys without a NULL, and after the boundary when there is one: a row comparison,
    which PostgreSQL serves from the key's index. The boundary's literals are PostgreSQL's
    own ``quote_literal`` output."""
    if not after:
        return _not_null(key)
    bound = sql.SQL(", ").join(sql.SQL(v) for v in after[0])
    return sql.SQL("{} AND ({}) > ({})").format(_not_null(key), _key_list(key), bound)


def _count(
    conn: psycopg.Connection[tuple[Any, ...]], schema: str, table: str, where: sql.Composable, limit: int | None = None
) -> int:
    rows = sql.SQL("SELECT 1 FROM {}.{} WHERE {}").format(sql.Identifier(schema), sql.Identifier(table), where)
    if limit is not None:
        rows = sql.SQL("{} LIMIT {}").format(rows, sql.Literal(limit))
    row = conn.execute(sql.SQL("SELECT count(*) FROM ({}) AS r").format(rows)).fetchone()
    return int(row[0]) if row else 0
