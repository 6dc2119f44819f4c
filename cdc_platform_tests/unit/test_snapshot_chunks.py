"""Key-range chunks of a snapshot (model/chunks.py): sizes and the WHERE clauses, in each
source's quoting (spark/test_snapshot.py and spark/test_polled_lake.py run them against
PostgreSQL and MariaDB), and how a generation's writer turns Parquet's dictionary off."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cdc_platform.lake.tables import DICTIONARY_SETTING, parquet_dictionary_off
from cdc_platform.model.chunks import chunk_count, chunk_predicates
from cdc_platform.sources.mysql.catalog import quote_mysql
from cdc_platform.sources.mysql.chunks import literal_kind
from cdc_platform.sources.postgres.chunks import sql_ident


@pytest.mark.parametrize(
    ("rows", "chunk_rows", "chunks"),
    [(0, 100, 1), (1, 100, 1), (100, 100, 1), (101, 100, 2), (1_050, 100, 11), (10_000_000, 100_000, 100)],
)
def test_as_few_chunks_as_the_configured_size_allows(rows: int, chunk_rows: int, chunks: int) -> None:
    assert chunk_count(rows, chunk_rows) == chunks


def test_one_key_column_ranges_cover_below_between_and_above() -> None:
    assert chunk_predicates(["id"], [("10",), ("20",)], key_nullable=False, quote=sql_ident) == [
        '"id" <= 10',
        '"id" > 10 AND "id" <= 20',
        '"id" > 20',
    ]


def test_a_composite_key_compares_rows_and_a_nullable_key_gets_its_null_chunk() -> None:
    predicates = chunk_predicates(['te"nant', "n"], [("'a'", "5")], key_nullable=True, quote=sql_ident)
    assert predicates == [
        '("te""nant", "n") <= (\'a\', 5) AND "te""nant" IS NOT NULL AND "n" IS NOT NULL',
        '("te""nant", "n") > (\'a\', 5) AND "te""nant" IS NOT NULL AND "n" IS NOT NULL',
        '"te""nant" IS NULL OR "n" IS NULL',
    ]


def test_a_row_whose_composite_key_holds_a_null_is_in_the_null_chunk_only() -> None:
    """A row comparison is decided by the first unequal column: ('a', NULL) <= ('b', 5) is
    true in PostgreSQL and MariaDB, so without the NOT NULL guard that row was in a range
    chunk and in the NULL chunk (read twice)."""
    predicates = chunk_predicates(["tenant", "n"], [("'b'", "5")], key_nullable=True, quote=sql_ident)
    ranges, nulls = predicates[:-1], predicates[-1]
    assert all(p.endswith('AND "tenant" IS NOT NULL AND "n" IS NOT NULL') for p in ranges)
    assert nulls == '"tenant" IS NULL OR "n" IS NULL'
    # one column: a NULL compares to nothing, no guard needed
    assert chunk_predicates(["id"], [("10",)], key_nullable=True, quote=sql_ident) == [
        '"id" <= 10',
        '"id" > 10',
        '"id" IS NULL',
    ]


def test_a_table_of_one_chunk_is_read_whole() -> None:
    assert chunk_predicates(["id"], [], key_nullable=True, quote=sql_ident) == ["TRUE"]


def test_mariadb_ranges_quote_with_backticks_and_spell_out_a_composite_key() -> None:
    """MariaDB scans the whole table for a row comparison, ``(a, b) > (x, y)``, so a
    composite key's ranges are written column by column, which its range optimizer serves."""
    assert chunk_predicates(
        ["te`nant", "n"], [("'a\\'b'", "'5'")], key_nullable=False, quote=quote_mysql, row_values=False
    ) == [
        "(`te``nant` < 'a\\'b' OR (`te``nant` = 'a\\'b' AND `n` <= '5'))",
        "(`te``nant` > 'a\\'b' OR (`te``nant` = 'a\\'b' AND `n` > '5'))",
    ]


def test_a_key_spelled_out_column_by_column_puts_every_row_in_the_same_chunk_as_a_row_comparison() -> None:
    """Both spellings, evaluated by SQLite (row values and NULL logic as in SQL) on every
    row of a grid with NULLs: the same chunk for each row, every row in exactly one."""
    import itertools
    import sqlite3

    values = [None, 0, 1, 2, 3]
    rows = list(itertools.product(values, values, values))
    boundaries = [("0", "2", "1"), ("1", "1", "3"), ("2", "0", "0"), ("2", "3", "3")]
    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE t ("a" int, "b" int, "c" int)')
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)

    def chunk_of_each_row(row_values: bool) -> dict[tuple[object, ...], list[int]]:
        chunks: dict[tuple[object, ...], list[int]] = {row: [] for row in rows}
        for number, predicate in enumerate(
            chunk_predicates(["a", "b", "c"], boundaries, key_nullable=True, quote=sql_ident, row_values=row_values)
        ):
            for row in db.execute(f"SELECT a, b, c FROM t WHERE {predicate}"):
                chunks[row].append(number)
        return chunks

    spelled_out, row_comparison = chunk_of_each_row(False), chunk_of_each_row(True)
    assert spelled_out == row_comparison
    assert all(len(chunks) == 1 for chunks in spelled_out.values())


@pytest.mark.parametrize(
    ("column_type", "decode", "kind"),
    [("enum('sad','happy')", "text", "index"), ("set('a','b')", "text", "index"), ("varbinary(16)", "hex", "hex"),
     ("varchar(20)", "plain", "quote"), ("bigint(20) unsigned", "text", "quote")],
)  # fmt: skip
def test_mariadb_boundaries_are_written_in_the_order_order_by_uses(column_type: str, decode: str, kind: str) -> None:
    """ORDER BY sorts an ENUM or SET by index (a label literal would compare by label),
    and bytes as bytes."""
    assert literal_kind(column_type, decode) == kind


class _Conf:
    """What ``parquet_dictionary_off`` uses of a session's runtime config."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values = dict(values or {})

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class _Session:
    def __init__(self, conf: _Conf) -> None:
        self.conf = conf


def test_a_writer_block_turns_the_dictionary_off_while_any_block_needs_it_and_leaves_the_users_setting() -> None:
    """Two blocks of one session overlap (two generations in one process): a column both
    name stays off until the last one ends, then the session is as it was. A column the
    user set in spark.conf keeps the user's value; a dotted name (a nested path to Parquet)
    is left alone."""
    user = DICTIONARY_SETTING.format("note")
    conf = _Conf({user: "true"})
    session = cast(Any, _Session(conf))
    with parquet_dictionary_off(session, ["id", "pair", "note", "a.b"]) as first:
        assert first == ("id", "pair")
        assert conf.values == {user: "true", DICTIONARY_SETTING.format("id"): "false",
                               DICTIONARY_SETTING.format("pair"): "false"}  # fmt: skip
        with parquet_dictionary_off(session, ["pair", "code"]) as second:
            assert second == ("pair", "code")
        assert set(conf.values) == {user, DICTIONARY_SETTING.format("id"), DICTIONARY_SETTING.format("pair")}
    assert conf.values == {user: "true"}
