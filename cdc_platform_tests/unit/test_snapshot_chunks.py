"""Key-range chunks of a PostgreSQL snapshot (sources/postgres/chunks.py): sizes and the
WHERE clauses; integration/test_snapshot_chunks.py runs them against PostgreSQL."""

from __future__ import annotations

import pytest

from cdc_platform.sources.postgres.chunks import chunk_count, chunk_predicates


@pytest.mark.parametrize(
    ("rows", "chunk_rows", "chunks"),
    [(0, 100, 1), (1, 100, 1), (100, 100, 1), (101, 100, 2), (1_050, 100, 11), (10_000_000, 100_000, 100)],
)
def test_as_few_chunks_as_the_configured_size_allows(rows: int, chunk_rows: int, chunks: int) -> None:
    assert chunk_count(rows, chunk_rows) == chunks


def test_one_key_column_ranges_cover_below_between_and_above() -> None:
    assert chunk_predicates(["id"], [("10",), ("20",)], key_nullable=False) == [
        '"id" <= 10',
        '"id" > 10 AND "id" <= 20',
        '"id" > 20',
    ]


def test_a_composite_key_compares_rows_and_a_nullable_key_gets_its_null_chunk() -> None:
    predicates = chunk_predicates(['te"nant', "n"], [("'a'", "5")], key_nullable=True)
    assert predicates == [
        '("te""nant", "n") <= (\'a\', 5)',
        '("te""nant", "n") > (\'a\', 5)',
        '"te""nant" IS NULL OR "n" IS NULL',
    ]


def test_a_table_of_one_chunk_is_read_whole() -> None:
    assert chunk_predicates(["id"], [], key_nullable=True) == ["TRUE"]
