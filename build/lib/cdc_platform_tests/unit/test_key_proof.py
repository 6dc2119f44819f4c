"""Key uniqueness shown from file slices (``lake/key_proof.py``), without Spark: what the
Python workers report per slice, and when the slices prove the keys unique. The proof
must never call duplicates unique; it may fail to show unique keys (the caller counts)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from cdc_platform.lake.key_proof import SliceSummary, file_summaries, proven_unique, summarize_slices

Row = tuple[Any, ...]


def _batches(slices: Sequence[Sequence[Row]], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The slices' rows in order, each row (key columns..., slice id), cut into batches of
    ``batch_rows`` whatever the slice boundaries (a worker sees batches, not files)."""
    rows = [(*row, number) for number, keys in enumerate(slices) for row in keys]
    width = len(rows[0]) if rows else 2
    for start in range(0, len(rows), batch_rows):
        part = rows[start : start + batch_rows]
        yield pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in part]) for i in range(width)], names=[f"c{i}" for i in range(width)]
        )


def _summaries(slices: Sequence[Sequence[Row]], batch_rows: int = 3) -> list[SliceSummary]:
    key_count = len(next(iter(s[0] for s in slices if s)))
    return [_as_summary(b.to_pylist()[0], key_count) for b in summarize_slices(_batches(slices, batch_rows), key_count)]


def _as_summary(row: dict[str, Any], key_count: int) -> SliceSummary:
    """A worker's output row as the driver reads it (a key with a NULL is no bound)."""
    low = tuple(row[f"low_k{i}"] for i in range(key_count))
    high = tuple(row[f"high_k{i}"] for i in range(key_count))
    return SliceSummary(row["rows"], row["nulls"], row["distinct"], None if None in low else low,
                        None if None in high else high)  # fmt: skip


def test_each_slice_is_summarized_whatever_the_batches() -> None:
    slices = [[(5,), (3,), (4,)], [(9,), (7,)], [(12,), (10,), (11,), (13,)]]
    for batch_rows in (1, 2, 3, 100):
        summaries = _summaries(slices, batch_rows)
        assert [(s.rows, s.distinct, s.low, s.high) for s in summaries] == [
            (3, 3, (3,), (5,)), (2, 2, (7,), (9,)), (4, 4, (10,), (13,)),
        ], batch_rows  # fmt: skip
        assert proven_unique(summaries)


def test_a_key_twice_in_one_slice_is_not_shown_unique() -> None:
    summaries = _summaries([[(1,), (2,)], [(5,), (6,), (5,)]])
    assert [s.distinct for s in summaries] == [2, 2]
    assert not proven_unique(summaries)


def test_a_key_in_two_slices_is_not_shown_unique() -> None:
    assert not proven_unique(_summaries([[(1,), (4,)], [(4,), (9,)]]))  # ranges touch at 4
    assert not proven_unique(_summaries([[(1,), (8,)], [(5,)]]))  # one range inside another


def test_null_keys_are_counted_and_never_shown_unique() -> None:
    summaries = _summaries([[("a", 1), ("a", None), (None, 3)], [("b", 1)]])
    assert [s.nulls for s in summaries] == [2, 0]
    assert summaries[0].low == summaries[0].high == ("a", 1)
    assert not proven_unique(summaries)


def test_composite_keys_compare_column_by_column() -> None:
    disjoint = [[("a", 5), ("a", 1)], [("a", 6), ("b", 0)], [("b", 1), ("c", -4)]]
    assert proven_unique(_summaries(disjoint))
    overlapping = [[("a", 1), ("b", 9)], [("a", 7)]]  # ("a", 7) lies between ("a", 1) and ("b", 9)
    assert not proven_unique(_summaries(overlapping))


def test_text_keys_compare_as_their_bytes() -> None:
    slices = [[("Zebra",), ("apple",)], [("zoo",), ("épée",)]]  # upper before lower before accented
    summaries = _summaries(slices)
    assert [(s.low, s.high) for s in summaries] == [(("Zebra",), ("apple",)), (("zoo",), ("épée",))]
    assert proven_unique(summaries)


def test_no_random_table_with_a_duplicate_is_shown_unique() -> None:
    """Soundness over many shapes: keys from a small domain (duplicates likely), slices of
    random sizes, sometimes key ranges (the shape of a generation), sometimes not. Every
    table shown unique has unique keys, and every table of unique key ranges is shown so."""
    rng = random.Random(20261127)
    shown = duplicates = 0
    for _ in range(400):
        keys = [(rng.randrange(60), rng.choice("xy")) for _ in range(rng.randrange(1, 40))]
        if rng.random() < 0.5:
            keys = sorted(set(keys)) if rng.random() < 0.7 else sorted(keys)
        cuts = sorted(rng.sample(range(1, len(keys)), min(len(keys) - 1, rng.randrange(0, 5)))) if len(keys) > 1 else []
        slices = [keys[a:b] for a, b in zip([0, *cuts], [*cuts, len(keys)], strict=True)]
        rng.shuffle(slices)  # a task reads its files in any order
        unique = len(set(keys)) == len(keys)
        proven = proven_unique(_summaries(slices, rng.randrange(1, 8)))
        assert unique or not proven, slices
        ordered = sorted(slices, key=min)
        if unique and all(max(a) < min(b) for a, b in itertools.pairwise(ordered)):
            assert proven, slices  # disjoint key ranges: the generation's own shape
        shown += proven
        duplicates += not unique
    assert shown > 50 and duplicates > 50  # both kinds of table were tried


def test_every_key_type_the_proof_trusts_is_summarized() -> None:
    """The Arrow types Spark hands the workers for the key types ``comparable`` lets
    through: decimal, date, binary, boolean, timestamp without zone (with zone: as
    microseconds, a bigint)."""
    from datetime import date, datetime
    from decimal import Decimal

    cases: list[tuple[pa.DataType, list[Any]]] = [
        (pa.decimal128(12, 2), [Decimal("10.50"), Decimal("-3.25"), Decimal("99.99"), Decimal("100.00")]),
        (pa.date32(), [date(1582, 10, 4), date(1, 1, 1), date(2026, 11, 27), date(9999, 12, 31)]),
        (pa.binary(), [b"\x00\xff", b"\x00", b"\x01", b"\xff\xff"]),
        (pa.bool_(), [True, False, None, None]),
        (pa.timestamp("us"), [datetime(2026, 3, 29, 1), datetime(2026, 3, 29, 0, 59), datetime(2027, 1, 1),
                              datetime(2028, 1, 1)]),
    ]  # fmt: skip
    for arrow_type, values in cases:
        keys = pa.array(values, arrow_type)
        batch = pa.RecordBatch.from_arrays([keys, pa.array([0, 0, 1, 1])], names=["k", "slice"])
        summaries = [b.to_pylist()[0] for b in summarize_slices(iter([batch]), 1)]
        first, _ = summaries
        assert (first["rows"], first["distinct"], first["low_k0"], first["high_k0"]) == (
            2, 2, min(values[:2]), max(values[:2]),
        ), arrow_type  # fmt: skip
        shown = proven_unique([_as_summary(s, 1) for s in summaries])
        assert shown is (arrow_type != pa.bool_()), arrow_type  # two NULL booleans: never shown unique


# ---- from the Delta log's file statistics ----------------------------------------------

PREFIX = 32  # Delta's string statistics: the first 32 characters


def _delta_min(values: Sequence[Any]) -> Any:
    low = min(values)
    return low[:PREFIX] if isinstance(low, str) else low


def _delta_max(values: Sequence[Any]) -> Any:
    """As Delta records a max: a string longer than the prefix is cut and gets a tie-breaker
    character (``\\x7f``, what this lake's files hold), an instant is cut to milliseconds."""
    high = max(values)
    if isinstance(high, str) and len(high) > PREFIX:
        return high[:PREFIX] + "\x7f"
    return high


def _actions(files: Sequence[Sequence[Row]], **extra: list[Any]) -> pa.Table:
    """Delta add actions (``get_add_actions(flatten=True)``) of files holding these keys
    (first column ``k0``, then ``k1``…), statistics as Delta truncates them."""
    width = len(next(iter(f[0] for f in files if f)))
    columns: dict[str, list[Any]] = {"path": [f"part-{n}.parquet" for n in range(len(files))]}
    columns["num_records"] = [len(f) for f in files]
    for i in range(width):
        columns[f"null_count.k{i}"] = [sum(row[i] is None for row in f) for f in files]
        present = [[row[i] for row in f if row[i] is not None] for f in files]
        columns[f"min.k{i}"] = [_delta_min(p) if p else None for p in present]
        columns[f"max.k{i}"] = [_delta_max(p) if p else None for p in present]
    return pa.table({**columns, **extra})


def _from_log(files: Sequence[Sequence[Row]], **extra: list[Any]) -> bool | None:
    summaries = file_summaries(_actions(files, **extra), [f"k{i}" for i in range(len(files[0][0]))])
    return None if summaries is None else proven_unique(summaries)


def test_files_with_disjoint_key_ranges_are_shown_unique_from_their_statistics() -> None:
    files = [[(1,), (2,), (3,)], [(4,), (9,)], [(10,)]]
    assert _from_log(files) is True
    summaries = file_summaries(_actions(files), ["k0"])
    assert summaries is not None and [s.rows for s in summaries] == [3, 2, 1]


def test_statistics_that_overlap_or_touch_or_hold_nulls_show_nothing() -> None:
    assert _from_log([[(1,), (5,)], [(4,), (9,)]]) is False  # overlapping ranges
    assert _from_log([[(1,), (5,)], [(5,), (9,)]]) is False  # a key in both files
    assert _from_log([[(1,), (None,)], [(4,), (9,)]]) is False  # a NULL key


def test_a_composite_key_is_shown_by_its_first_column_alone() -> None:
    # chunks of (tenant, n) that split one tenant: the first columns touch, nothing is shown
    assert _from_log([[("a", 1), ("a", 2)], [("a", 3), ("b", 1)]]) is False
    assert _from_log([[("a", 1), ("a", 2)], [("b", 1), ("c", 1)]]) is True


def test_statistics_the_proof_cannot_trust_give_no_answer() -> None:
    files = [[(1,), (2,)], [(3,), (4,)]]
    assert _from_log([[(1.0,), (2.0,)], [(3.0,), (4.0,)]]) is None  # floating point
    assert file_summaries(_actions(files).drop_columns(["min.k0"]), ["k0"]) is None  # no statistics
    missing = _actions(files).set_column(1, "num_records", pa.array([2, None], pa.int64()))
    assert file_summaries(missing, ["k0"]) is None
    deletion_vector = pa.array([None, "u1234"], pa.string())
    assert _from_log(files, **{"deletionVector.storageType": deletion_vector}) is None  # type: ignore[arg-type]


def test_no_table_with_a_key_in_two_files_is_shown_unique_by_truncated_statistics() -> None:
    """Strings that share Delta's 32-character prefix and differ after it, below and above
    the tie-breaker (ASCII, accented, CJK): cut into files in key order, with one key copied
    into another file, the statistics never show them unique; without the copy, whatever
    they show is true."""
    rng = random.Random(17)
    prefixes = ["p" * PREFIX, "p" * (PREFIX - 1) + "q", "r"]
    tails = ["", "a", "~", "\x7f", "\x7f\x7f", "é", "ü1", "中", "zz"]
    for _ in range(400):
        keys = sorted({rng.choice(prefixes) + rng.choice(tails) + rng.choice(["", "0", "1"]) for _ in range(8)})
        cuts = sorted(rng.sample(range(1, len(keys)), k=min(len(keys) - 1, rng.randint(1, 3))))
        files = [[(k,) for k in keys[a:b]] for a, b in itertools.pairwise([0, *cuts, len(keys)])]
        source, target = rng.sample(range(len(files)), 2)
        copied = [list(f) for f in files]
        copied[target].append(rng.choice(files[source]))
        assert _from_log(copied) is False, copied
