"""A generation's validation shows its keys unique from its files (``lake/key_proof.py``)
and still rejects every duplicate: real Delta tables written by Spark, one file per
append as a generation writes one per chunk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cdc_platform.lake.key_proof import proven_unique, slice_summaries
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


def _plan(source_rows: int) -> Any:
    return cast(Any, SimpleNamespace(table="cap.public.t", source_rows=source_rows, schema=SimpleNamespace(key=KEY)))


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
    plan = cast(Any, SimpleNamespace(table="cap.public.f", source_rows=3, schema=SimpleNamespace(key=("x",))))
    with pytest.raises(GenerationRejectedError, match="holds 3 rows but 2 distinct keys"):
        validate(spark, path, plan, exact_count=False)
