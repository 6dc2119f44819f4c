"""A polled (MariaDB/MySQL) table split into key-range chunks of about the same number of
rows: the same plan as PostgreSQL's (``sources/postgres/chunks.py``, which says why key
ranges), in MariaDB's SQL.

The boundaries are every n-th key in key order (``ROW_NUMBER()``, MariaDB 10.2+ / MySQL
8), read back as literals and compared with the key columns as the table holds them, so
the ranges follow the ``ORDER BY`` that chose them (collation, unsigned integers) whatever
the key's type. ``QUOTE`` escapes with backslashes, so a server running with
``NO_BACKSLASH_ESCAPES`` would misread a boundary holding a quote or backslash; a binary
column's boundary is a hex literal instead, and an ENUM or SET column's is its index
(``ORDER BY`` sorts them by index, a string literal would compare by label). The planning
connection and the readers share the UTC session of ``connection.py``, so a TIMESTAMP
boundary means the same instant to both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdc_platform.model.chunks import chunk_count, chunk_predicates
from cdc_platform.sources.mysql.catalog import quote_mysql

ROW_NUMBER = "_cdc_chunk_row"


def literal_kind(source_type: str, decode: str) -> str:
    """How a key column's boundaries are written, by its MariaDB type (``COLUMN_TYPE``) and
    mapping: ``hex`` (bytes compare as bytes), ``index`` (ENUM, SET) or ``quote``."""
    if decode == "hex":
        return "hex"
    return "index" if source_type.lower().startswith(("enum(", "set(")) else "quote"


def boundaries_sql(
    source_table: str, key: Sequence[str], literals_as: Mapping[str, str], chunks: int, rows: int
) -> str:
    """The last key of each of ``chunks`` runs of equal length in key order but the last's,
    each column as a literal of its ``literal_kind`` (see the PostgreSQL module for the
    arithmetic)."""
    keys = ", ".join(quote_mysql(k) for k in key)
    literals = ", ".join(_literal(quote_mysql(k), literals_as.get(k, "quote")) for k in key)
    not_null = " AND ".join(f"{quote_mysql(k)} IS NOT NULL" for k in key)
    rn = quote_mysql(ROW_NUMBER)
    return (
        f"SELECT {literals} FROM (SELECT {keys}, ROW_NUMBER() OVER (ORDER BY {keys}) AS {rn} FROM {source_table} "
        f"WHERE {not_null}) AS ordered "
        f"WHERE {rn} < {rows} AND ({rn} * {chunks}) DIV {rows} > (({rn} - 1) * {chunks}) DIV {rows} ORDER BY {rn}"
    )


def _literal(ident: str, kind: str) -> str:
    if kind == "hex":
        return f"CONCAT('X''', HEX({ident}), '''')"
    if kind == "index":
        return f"CAST({ident} + 0 AS CHAR)"
    return f"QUOTE({ident})"


def plan_chunks(
    cur: Any, source_table: str, key: Sequence[str], literals_as: Mapping[str, str], key_nullable: bool, rows: int,
    chunk_rows: int,
) -> list[str]:  # fmt: skip
    """The table's chunks as WHERE clauses on its own columns; one chunk for a table of at
    most ``chunk_rows`` rows. ``rows``: the table's row count just before."""
    if rows <= chunk_rows:
        return ["TRUE"]
    cur.execute(boundaries_sql(source_table, key, literals_as, chunk_count(rows, chunk_rows), rows))
    boundaries = [tuple(_text(v) for v in row) for row in cur.fetchall()]
    return chunk_predicates(key, boundaries, key_nullable, quote_mysql, row_values=False)


def _text(literal: str | bytes) -> str:
    """A literal as the driver returns it (bytes when the server calls it binary)."""
    return literal.decode("utf-8") if isinstance(literal, bytes) else str(literal)
