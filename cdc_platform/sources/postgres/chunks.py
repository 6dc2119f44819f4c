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
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    literals = sql.SQL(", ").join(sql.SQL("quote_literal({}::text)").format(sql.Identifier(k)) for k in key)
    not_null = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in key)
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
