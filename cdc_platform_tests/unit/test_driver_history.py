"""A small history's batch sequenced in the driver and merged by delta-rs (``lake.driver_history``),
on a table delta-rs writes here: no Spark, no services. A composite key of text (with a quote,
which history's scan filters on in SQL) and an integer; versions, closes, TOAST kept from the
open version, duplicates, and the batches it leaves to Spark. The same rules against Spark's
apply, on a random redelivered history: ``spark/test_history.py``."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc_platform.config.model import TableConfig
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.lake.driver_history import apply_history_in_driver
from cdc_platform.lake.history import HISTORY_META
from cdc_platform.lake.tables import LakeTable

KEYS, COLUMNS = ["name", "n"], ["name", "n", "body"]
IMAGE = pa.struct([("name", pa.string()), ("n", pa.int32()), ("body", pa.string())])
T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
META_TYPES = {
    "timestamp": pa.timestamp("us", "UTC"), "boolean": pa.bool_(), "string": pa.string(), "bigint": pa.int64()
}  # fmt: skip


def _table(tmp_path: Path, **settings: Any) -> LakeTable:
    table = LakeTable(TableConfig(name="shop.public.people"), str(tmp_path), "topic", ValueEncoding(), **settings)
    schema = pa.schema([*IMAGE, *[(name, META_TYPES[kind]) for name, kind in HISTORY_META]])
    write_deltalake(table.history_path, schema.empty_table())
    return table


def _events(*events: tuple[str, str, int, str | None, int, int], toasted: tuple[int, ...] = ()) -> pa.Table:
    """(op, name, n, body, commit position, seconds after T0): an event per row, at the next
    offsets; the events at ``toasted`` did not carry ``body`` (an unchanged TOASTed value)."""
    rows = []
    for i, (op, name, n, body, commit, seconds) in enumerate(events):
        image = {"name": name, "n": n, "body": None if i in toasted else body}
        rows.append({
            "op": op, "commit_lsn": commit, "lsn": commit, "kafka_partition": 0, "kafka_offset": i,
            "source_ts": T0 + timedelta(seconds=seconds),
            "before": image if op == "d" else None, "after": None if op == "d" else image,
            "unavailable": ["body"] if i in toasted else [],
        })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=_EVENTS)


_EVENTS = pa.schema([
    ("op", pa.string()), ("commit_lsn", pa.int64()), ("lsn", pa.int64()), ("kafka_partition", pa.int32()),
    ("kafka_offset", pa.int64()), ("source_ts", pa.timestamp("us", "UTC")), ("before", IMAGE), ("after", IMAGE),
    ("unavailable", pa.list_(pa.string())),
])  # fmt: skip


def _versions(table: LakeTable) -> list[tuple[Any, ...]]:
    rows = DeltaTable(table.history_path).to_pyarrow_table().to_pylist()
    return sorted(
        (r["name"], r["n"], r["body"], r["_cdc_op"], r["_cdc_commit_lsn"], r["_cdc_end_commit_lsn"], r["is_current"],
         _seconds(r["valid_from"]), _seconds(r["valid_to"]))
        for r in rows
    )  # fmt: skip


def _seconds(ts: datetime | None) -> int | None:
    return None if ts is None else int((ts - T0).total_seconds())


def test_versions_open_and_close_per_key_with_toasted_values_kept(tmp_path: Path) -> None:
    table = _table(tmp_path)
    first = apply_history_in_driver(table, _events(
        ("c", "o'brien", 1, "a", 10, 0),
        ("c", "o'brien", 2, "b", 11, 1),
        ("u", "o'brien", 1, "a2", 12, 2),
    ), KEYS, COLUMNS)  # fmt: skip
    assert first is not None and (first.versions_opened, first.versions_closed) == (3, 1)
    second = apply_history_in_driver(table, _events(
        ("u", "o'brien", 1, "a2", 12, 2),  # re-sent: at its key's newest position, adds nothing
        ("u", "o'brien", 1, None, 13, 5),  # body unchanged and TOASTed: kept from the open version
        ("u", "o'brien", 1, None, 13, 5),  # the same event twice in one batch: one version
        ("d", "o'brien", 2, "b", 14, 4),  # closes the open version of key 2
        ("c", "o'brien", 2, "b2", 15, 6),
        toasted=(1, 2),
    ), KEYS, COLUMNS)  # fmt: skip
    assert second is not None and (second.versions_opened, second.versions_closed) == (2, 2)
    assert _versions(table) == [
        ("o'brien", 1, "a", "c", 10, 12, False, 0, 2),
        ("o'brien", 1, "a2", "u", 12, 13, False, 2, 5),
        ("o'brien", 1, "a2", "u", 13, None, True, 5, None),  # TOASTed body from the version before
        ("o'brien", 2, "b", "c", 11, 14, False, 1, 4),
        ("o'brien", 2, "b2", "c", 15, None, True, 6, None),
    ]
    commits = [c for c in DeltaTable(table.history_path).history() if c.get("operation") == "MERGE"]
    assert len(commits) == 2, commits
    again = apply_history_in_driver(table, _events(("d", "o'brien", 2, "b", 14, 4)), KEYS, COLUMNS)
    assert again is not None and (again.versions_opened, again.versions_closed) == (0, 0)
    assert len([c for c in DeltaTable(table.history_path).history() if c.get("operation") == "MERGE"]) == 2


def test_a_version_never_starts_before_its_keys_last_time(tmp_path: Path) -> None:
    """An event dated before its key's last time in history (a generation's correction, dated
    at its snapshot) starts when that version ended, as Spark's apply dates it."""
    table = _table(tmp_path)
    apply_history_in_driver(table, _events(("c", "x", 1, "a", 10, 60)), KEYS, COLUMNS)
    apply_history_in_driver(table, _events(("u", "x", 1, "b", 20, 30), ("u", "x", 1, "c", 30, 40)), KEYS, COLUMNS)
    assert [(v[2], v[7], v[8]) for v in _versions(table)] == [("a", 60, 60), ("b", 60, 60), ("c", 60, None)]


def test_the_batches_the_driver_leaves_to_spark(tmp_path: Path) -> None:
    """A truncate, a NULL key, a floating-point key, a history above the bound: None, and
    nothing written. Spark applies those (``current._apply_history``)."""
    table = _table(tmp_path)
    assert apply_history_in_driver(table, _events(("c", "a", 1, "x", 10, 0), ("c", "b", 1, "x", 11, 0)), KEYS, COLUMNS)
    version = DeltaTable(table.history_path).version()
    truncate = _events(("t", "a", 1, "x", 12, 1))
    assert apply_history_in_driver(table, truncate, KEYS, COLUMNS) is None
    null_key = _events(("u", "a", 1, "y", 12, 1)).to_pylist()
    null_key[0]["after"]["n"] = None
    assert apply_history_in_driver(table, pa.Table.from_pylist(null_key, schema=_EVENTS), KEYS, COLUMNS) is None
    floats = pa.struct([("name", pa.string()), ("n", pa.float64()), ("body", pa.string())])
    float_events = _events(("u", "a", 1, "y", 12, 1))
    float_events = float_events.cast(
        pa.schema([f.with_type(floats) if f.name in ("before", "after") else f for f in float_events.schema])
    )
    assert apply_history_in_driver(table, float_events, KEYS, COLUMNS) is None
    bounded = dataclasses.replace(table, driver_merge_max_rows=1)  # history holds 2 versions
    assert apply_history_in_driver(bounded, _events(("u", "a", 1, "y", 12, 1)), KEYS, COLUMNS) is None
    assert DeltaTable(table.history_path).version() == version
    assert apply_history_in_driver(table, _events(("u", "a", 1, "y", 12, 1)), KEYS, COLUMNS) is not None
