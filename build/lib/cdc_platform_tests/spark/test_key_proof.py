"""A generation's validation shows its keys unique from its files (``lake/key_proof.py``)
and still rejects every duplicate: real Delta tables written by Spark, one file per
append as a generation writes one per chunk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cdc_platform.lake.key_proof import proven_unique, slice_summaries, statistics_summaries
from cdc_platform.lake.snapshot import validate
from cdc_platform.model.errors import GenerationRejectedError

KEY = ("region", "n", "at")
SCHEMA = "region string, n long, at timestamp, _metadata string"  # a column named as Spark's file metadata
START = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # compared as microseconds, never as local wall time


def _chunks(spark: Any, path: Path, chunks: list[list[tuple[str, int, int]]]) -> Any:
    """One Delta append, one file, per chunk of (region, n, minutes after START)."""
    for rows in chunks:
        data = [(r, n, START + timedelta(minutes=m), f"{r}{n}") for r, n, m in rows]
        spark.createDataFrame(data, SCHEMA).coalesce(1).write.format("delta").mode("append").save(str(path))
    return spark.read.format("delta").load(str(path))


def _plan(source_rows: int, unique_per_chunk: bool = False) -> Any:
    return cast(
        Any,
        SimpleNamespace(
            table="cap.public.t", source_rows=source_rows, schema=SimpleNamespace(key=KEY),
            key_unique_per_chunk=unique_per_chunk,
        ),
    )  # fmt: skip


def test_key_range_files_show_unique_keys_without_counting(spark: Any, tmp_path: Path) -> None:
    chunks = [
        [("eu", n, 60 * n) for n in range(40, 0, -1)],  # a chunk's rows in any order
        [("eu", n, 60 * n) for n in range(41, 90)],
        [("us", n, n) for n in range(0, 30)],
    ]
    written = _chunks(spark, tmp_path / "t", chunks)
    slices = slice_summaries(written, KEY)
    assert slices is not None and len(slices) == 3
    assert sorted(s.rows for s in slices) == [30, 40, 49] and proven_unique(slices)
    assert validate(spark, str(tmp_path / "t"), _plan(119), exact_count=True) == 119


@pytest.mark.parametrize(
    ("chunks", "distinct"),
    [
        ([[("eu", 1, 0), ("eu", 2, 0)], [("eu", 2, 0), ("eu", 3, 0)]], 3),  # one key in two files
        ([[("eu", 1, 0), ("eu", 9, 5), ("eu", 1, 0)], [("us", 1, 0)]], 3),  # twice in one file
        ([[("eu", 1, 0), ("us", 1, 0)], [("eu", 5, 0), ("us", 1, 0)]], 3),  # ranges overlapping, not touching
    ],
)
def test_every_duplicate_is_still_rejected(spark: Any, tmp_path: Path, chunks: Any, distinct: int) -> None:
    written = _chunks(spark, tmp_path / "t", chunks)
    slices = slice_summaries(written, KEY)
    assert slices is not None and not proven_unique(slices)
    with pytest.raises(GenerationRejectedError, match=f"holds 4 rows but {distinct} distinct keys"):
        validate(spark, str(tmp_path / "t"), _plan(4), exact_count=False)


def test_keys_of_a_type_the_proof_does_not_trust_are_counted(spark: Any, tmp_path: Path) -> None:
    """Floating point (NaN, -0.0) has no order Spark, Arrow and Python agree on: no proof,
    and validation counts with Spark, duplicates rejected as before."""
    path = str(tmp_path / "f")
    for values in ([(0.5, "a"), (1.5, "b")], [(1.5, "c")]):
        spark.createDataFrame(values, "x double, v string").coalesce(1).write.format("delta").mode("append").save(path)
    assert slice_summaries(spark.read.format("delta").load(path), ("x",)) is None
    plan = cast(
        Any,
        SimpleNamespace(
            table="cap.public.f", source_rows=3, schema=SimpleNamespace(key=("x",)), key_unique_per_chunk=True
        ),
    )
    with pytest.raises(GenerationRejectedError, match="holds 3 rows but 2 distinct keys"):
        validate(spark, path, plan, exact_count=False)


def test_a_source_unique_key_is_shown_from_the_logs_statistics_alone(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """When each file is one read under the source's unique key, the Delta log's min and max
    of the key's first column show the files disjoint without reading a row; the count is
    the log's too (and must still equal the source's)."""
    chunks = [[("eu", n, n) for n in range(1, 30)], [("fr", n, n) for n in range(0, 20)], [("us", 1, 0)]]
    _chunks(spark, tmp_path / "t", chunks)
    files = statistics_summaries(str(tmp_path / "t"), KEY)
    assert files is not None and sorted(f.rows for f in files) == [1, 20, 29] and proven_unique(files)
    with caplog.at_level("INFO", logger="cdc_platform.snapshot"):
        assert validate(spark, str(tmp_path / "t"), _plan(50, unique_per_chunk=True), exact_count=True) == 50
    assert "files' statistics" in caplog.text
    with pytest.raises(GenerationRejectedError, match="wrote 50 rows but the source had 51"):
        validate(spark, str(tmp_path / "t"), _plan(51, unique_per_chunk=True), exact_count=True)


@pytest.mark.parametrize(
    "chunks",
    [
        [[("eu", 1, 0), ("eu", 2, 0)], [("eu", 2, 0), ("eu", 3, 0)]],  # one key in two files
        [[("eu", 1, 0), ("us", 1, 0)], [("eu", 5, 0), ("us", 1, 0)]],  # ranges overlapping
    ],
)
def test_a_key_in_two_files_is_rejected_even_when_the_source_vouches_for_each_file(
    spark: Any, tmp_path: Path, chunks: Any
) -> None:
    _chunks(spark, tmp_path / "t", chunks)
    files = statistics_summaries(str(tmp_path / "t"), KEY)
    assert files is not None and not proven_unique(files)
    with pytest.raises(GenerationRejectedError, match="holds 4 rows but 3 distinct keys"):
        validate(spark, str(tmp_path / "t"), _plan(4, unique_per_chunk=True), exact_count=False)


def test_files_rewritten_by_another_operation_are_not_trusted_as_reads(spark: Any, tmp_path: Path) -> None:
    """OPTIMIZE packs rows of several writes into one file: a file is then no single read,
    so its keys are not taken as distinct, and the rows are read (a duplicate inside the
    packed file is still found)."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    _chunks(spark, tmp_path / "t", [[("eu", 1, 0), ("eu", 2, 0)], [("eu", 2, 0)], [("us", 1, 0)]])
    DeltaTable.forPath(spark, path).optimize().executeCompaction()
    assert statistics_summaries(path, KEY) is None
    with pytest.raises(GenerationRejectedError, match="holds 4 rows but 3 distinct keys"):
        validate(spark, path, _plan(4, unique_per_chunk=True), exact_count=False)
