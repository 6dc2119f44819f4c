"""A batch into a small history, sequenced in the driver and merged by delta-rs instead of Spark.

History's apply through Spark costs about two seconds a batch whatever the batch's size: a
local checkpoint of the batch's sequence (history's scan for its keys, a window per
column), then Delta's MERGE, planned on the driver (docs/benchmarks.md, "A stream batch of
a table with history"). Each of those MERGEs also writes a deletion vector for every file
it touches, and the replaced vectors stay on disk for the retention (a day of them: ~6 800
files for the demo's customers). For a history of up to ``lake.driver_merge_max_rows``
versions (the bound small currents merge in the driver by), the batch is sequenced here,
in Arrow and a loop over its events, and delta-rs merges it: copy on write, no vectors.

The rules are ``history._apply_segment``'s, and ``spark/test_history.py`` holds both paths
to one model of the source:

* an event at or before its key's newest known position (a version's start or end) is a
  duplicate and adds nothing; of several events at one position, one counts;
* each ``c``/``u``/``r`` event opens a version valid from its commit time, never before
  its key's last time (in history, or earlier in the batch), until the key's next event;
* a column the event did not carry (TOAST) keeps the value of the key's previous event in
  the batch, else of its open version;
* the key's open version is closed at its first new event.

Spark applies the batch instead when it holds a truncate (it closes every older version,
a table-wide update), when a key is NULL (Spark's joins never match it) or of a type
Arrow's grouping does not compare as Spark's (floating point), when a column name is one
the merge's SQL would have to escape, when history holds more rows than the bound, and
when delta-rs does not write the table's features or refused it once (``driver_merge``).
An error before delta-rs' commit wrote nothing; after it, Spark's apply finds every event
at or before its key's position and adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.checksums import drop_stale_checkpoint_checksum
from cdc_platform.lake.driver_merge import (
    EVENT_ORDER,
    arrow_schema_of,
    delta_rs_writes,
    driver_merge_bound,
    driver_writes,
    groupable,
    plain_name,
    refuse,
)
from cdc_platform.lake.history import HistoryResult
from cdc_platform.lake.tables import LakeTable

if TYPE_CHECKING:
    import pyarrow as pa

# what the driver reads of history's versions of the batch's keys (and, when an event of
# the batch did not carry a column, the open version's values)
POSITIONS = (
    "_cdc_commit_lsn",
    "_cdc_lsn",
    "_cdc_end_commit_lsn",
    "_cdc_end_lsn",
    "is_current",
    "valid_from",
    "valid_to",
)
# batch keys up to which history's scan is filtered in SQL (an IN list) rather than in Arrow
SQL_KEYS_MAX = 1_000
# the event columns the sequence reads (a held batch has them all; ``collected_events`` collects them)
HISTORY_EVENT_COLUMNS = (*EVENT_ORDER, "op", "source_ts", "before", "after", "unavailable")

Key = tuple[Any, ...]


@dataclass
class _Known:
    """A key's versions in history: its newest position, its last time, its open version's row."""

    last: tuple[int, int]
    last_ts: datetime | None
    open_row: int | None = None
    open_commit: int = -1


@dataclass
class _Versions:
    """What a batch adds to history, as indexes: event rows for keys and values, history rows
    for a value the key's open version keeps. One entry per new or closed version."""

    close: list[bool] = field(default_factory=list)
    key_event: list[int] = field(default_factory=list)
    values: list[list[int | None]] = field(default_factory=list)  # per column: an index into events + history
    valid_from: list[datetime | None] = field(default_factory=list)
    valid_to: list[datetime | None] = field(default_factory=list)
    op: list[str | None] = field(default_factory=list)
    start: list[tuple[int | None, int | None]] = field(default_factory=list)
    end: list[tuple[int | None, int | None]] = field(default_factory=list)
    opened: int = 0
    closed: int = 0


def apply_history_in_driver(
    table: LakeTable, events: pa.Table, keys: list[str], columns: list[str]
) -> HistoryResult | None:
    """``events`` (changelog columns, ``HISTORY_EVENT_COLUMNS`` at least; no truncate) applied to
    ``table``'s history by delta-rs. None when Spark must apply them (see the module's docstring)."""
    from deltalake import DeltaTable

    path = table.history_path
    if not driver_writes(path) or not all(plain_name(c) for c in [*keys, *columns]):
        return None
    keyed = _keyed_events(events, keys)
    if keyed is None:
        return None
    if keyed.num_rows == 0:
        return HistoryResult(0, 0)
    try:
        target = DeltaTable(path)
        bound = driver_merge_bound(table)
        if bound <= 0 or target.count() > bound or not delta_rs_writes(target, table.key, path, "history merged"):
            return None
        schema = arrow_schema_of(target)
        times = schema.field("valid_from").type  # a held batch's may lack the zone
        keyed = keyed.set_column(keyed.schema.get_field_index("source_ts"), "source_ts", keyed["source_ts"].cast(times))
        carried_by_all = all(not u for u in keyed["unavailable"].to_pylist())
        history = _history_of(target, schema, keys, [] if carried_by_all else columns, keyed)
        versions = _sequence(keyed, history, keys, columns)
        if versions.opened or versions.closed:
            _merge(target, _merge_source(schema, keyed, history, versions, keys, columns), keys, columns)
            drop_stale_checkpoint_checksum(path)
    except Exception as exc:  # Spark applies the batch instead (again harmless: see the module's docstring)
        refuse(table.key, path, "history merged", f"{type(exc).__name__}: {exc}")
        return None
    return HistoryResult(versions.opened, versions.closed)


def _keyed_events(events: pa.Table, keys: list[str]) -> pa.Table | None:
    """The batch's events in order (commit LSN, LSN, Kafka partition, offset), each with its
    key (``__key_i``: the before image's for a delete). None when a key is NULL, a truncate
    is among them, or a key's type is not one Arrow groups as Spark does."""
    import pyarrow.compute as pc

    image = events.schema.field("after").type
    names = {image.field(i).name: image.field(i).type for i in range(image.num_fields)}
    if not all(k in names and groupable(names[k]) for k in keys):
        return None
    if pc.any(pc.equal(events["op"], "t")).as_py():
        return None
    rows = events.take(pc.sort_indices(events, [(c, "ascending") for c in EVENT_ORDER]))
    delete = pc.equal(rows["op"], "d")
    for i, k in enumerate(keys):
        key = pc.if_else(delete, pc.struct_field(rows["before"], k), pc.struct_field(rows["after"], k))
        if key.null_count:
            return None
        rows = rows.append_column(f"__key_{i}", key)
    return rows


def _key_tuples(rows: pa.Table, names: Sequence[str]) -> list[Key]:
    return list(zip(*(rows[n].to_pylist() for n in names), strict=True))


@dataclass
class _History:
    rows: pa.Table  # history's versions of the batch's keys (positions, times, values when needed)
    known: dict[Key, _Known]


def _history_of(target: Any, schema: pa.Schema, keys: list[str], columns: list[str], keyed: pa.Table) -> _History:
    """History's versions of the batch's keys: per key its newest position, last time and
    open version (``history._unseen_events``' aggregation)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = list(dict.fromkeys([*keys, *POSITIONS, *columns]))
    reader = target.scan(columns=names, predicate=_key_predicate(keys, keyed))
    rows = pa.table(reader.read_all()).select(names)
    rows = rows.cast(pa.schema([schema.field(n) for n in names]))  # DataFusion's string_view, back to the table's
    for i, k in enumerate(keys):
        rows = rows.filter(pc.is_in(rows[k], value_set=pc.unique(keyed[f"__key_{i}"]).cast(rows[k].type)))
    known: dict[Key, _Known] = {}
    ends = zip(*(rows[c].to_pylist() for c in POSITIONS), strict=True)
    for row, (key, (commit, lsn, end_commit, end_lsn, is_open, valid_from, valid_to)) in enumerate(
        zip(_key_tuples(rows, keys), ends, strict=True)
    ):
        newest = (end_commit if end_commit is not None else commit, end_lsn if end_lsn is not None else lsn)
        ts = valid_to if valid_to is not None else valid_from
        seen = known.get(key)
        if seen is None:
            seen = known[key] = _Known(newest, ts)
        else:
            seen.last = max(seen.last, newest)
            seen.last_ts = _greatest(seen.last_ts, ts)
        if is_open and commit > seen.open_commit:
            seen.open_row, seen.open_commit = row, commit
    return _History(rows, known)


def _key_predicate(keys: list[str], keyed: pa.Table) -> str | None:
    """An SQL filter on the batch's keys for history's scan (integer and text keys, up to
    ``SQL_KEYS_MAX`` of them), so DataFusion skips what their statistics rule out; None
    reads every version's positions (the rows are filtered in Arrow either way)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    terms = []
    for i, k in enumerate(keys):
        values = pc.unique(keyed[f"__key_{i}"])
        if len(values) > SQL_KEYS_MAX:
            return None
        if pa.types.is_integer(values.type):
            literals = [str(v) for v in values.to_pylist()]
        elif pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            literals = ["'" + str(v).replace("'", "''") + "'" for v in values.to_pylist()]
        else:
            continue
        terms.append(f'"{k}" IN ({", ".join(literals)})')
    return " AND ".join(terms) or None


def _sequence(keyed: pa.Table, history: _History, keys: list[str], columns: list[str]) -> _Versions:
    """Each key's new events in order: the versions they open and close (``history._sequence``)."""
    ops = keyed["op"].to_pylist()
    commits, lsns = keyed["commit_lsn"].to_pylist(), keyed["lsn"].to_pylist()
    times = keyed["source_ts"].to_pylist()
    unavailable = [set(u or ()) for u in keyed["unavailable"].to_pylist()]
    by_key: dict[Key, list[int]] = {}
    for event, key in enumerate(_key_tuples(keyed, [f"__key_{i}" for i in range(len(keys))])):
        by_key.setdefault(key, []).append(event)
    versions = _Versions()
    offset = keyed.num_rows  # a value index at or above it is a history row's
    for key, events in by_key.items():
        known = history.known.get(key)
        new = _unseen(events, commits, lsns, known)
        if not new:
            continue
        last_ts = known.last_ts if known is not None else None
        starts: list[datetime | None] = []
        for event in new:
            last_ts = _greatest(last_ts, times[event])
            starts.append(last_ts)
        open_row = known.open_row if known is not None else None
        carried: list[int | None] = [None if open_row is None else offset + open_row] * len(columns)
        if known is not None and known.open_row is not None:
            versions.close.append(True)
            versions.key_event.append(new[0])
            versions.values.append([None] * len(columns))
            versions.valid_from.append(None)
            versions.valid_to.append(starts[0])
            versions.op.append(None)
            versions.start.append((None, None))
            versions.end.append((commits[new[0]], lsns[new[0]]))
            versions.closed += 1
        for n, event in enumerate(new):
            if ops[event] == "d":
                continue
            carried = [event if c not in unavailable[event] else carried[i] for i, c in enumerate(columns)]
            following = new[n + 1] if n + 1 < len(new) else None
            versions.close.append(False)
            versions.key_event.append(event)
            versions.values.append(carried)
            versions.valid_from.append(starts[n])
            versions.valid_to.append(None if following is None else starts[n + 1])
            versions.op.append(ops[event])
            versions.start.append((commits[event], lsns[event]))
            versions.end.append((None, None) if following is None else (commits[following], lsns[following]))
            versions.opened += 1
            versions.closed += following is not None
    return versions


def _unseen(events: list[int], commits: list[int], lsns: list[int], known: _Known | None) -> list[int]:
    """A key's events (in order) after its newest known position, one per position."""
    new: list[int] = []
    previous: tuple[int, int] | None = None
    for event in events:
        position = (commits[event], lsns[event])
        if position == previous:
            continue
        previous = position
        if known is None or position > known.last:
            new.append(event)
    return new


def _greatest(a: datetime | None, b: datetime | None) -> datetime | None:
    """SQL's ``greatest``: NULLs skipped."""
    if a is None:
        return b
    return a if b is None or a >= b else b


def _merge_source(
    schema: pa.Schema, keyed: pa.Table, history: _History, versions: _Versions, keys: list[str], columns: list[str]
) -> pa.Table:
    """The versions as the merge's source, in history's own types: ``__kind``, ``__k_i``
    (keys), ``__c_j`` (columns), then history's position and time columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    event_rows = pa.array(versions.key_event, pa.int64())
    out: dict[str, Any] = {"__kind": pa.array(["close" if c else "insert" for c in versions.close], pa.string())}
    for i, k in enumerate(keys):
        out[f"__k_{i}"] = keyed[f"__key_{i}"].take(event_rows).cast(schema.field(k).type)
    for j, c in enumerate(columns):
        kind = schema.field(c).type
        carried = pc.struct_field(keyed["after"], c).cast(kind).combine_chunks()
        kept = history.rows[c].cast(kind).combine_chunks() if c in history.rows.column_names else pa.nulls(0, kind)
        both = pa.concat_arrays([carried, kept])
        out[f"__c_{j}"] = both.take(pa.array([v[j] for v in versions.values], pa.int64()))
    times = schema.field("valid_from").type
    out["valid_from"] = pa.array(versions.valid_from, times)
    out["valid_to"] = pa.array(versions.valid_to, times)
    out["is_current"] = pa.array(
        [not c and e == (None, None) for c, e in zip(versions.close, versions.end, strict=True)]
    )
    out["_cdc_op"] = pa.array(versions.op, pa.string())
    for name, values in (
        ("_cdc_commit_lsn", [s[0] for s in versions.start]),
        ("_cdc_lsn", [s[1] for s in versions.start]),
        ("_cdc_end_commit_lsn", [e[0] for e in versions.end]),
        ("_cdc_end_lsn", [e[1] for e in versions.end]),
    ):
        out[name] = pa.array(values, pa.int64())
    return pa.table(out)


def _merge(target: Any, source: pa.Table, keys: list[str], columns: list[str]) -> None:
    """``history._merge_versions`` in delta-rs: a close ends its key's open version, every
    other row is a new version."""
    match = " AND ".join(f'(t."{k}" IS NOT DISTINCT FROM s."__k_{i}")' for i, k in enumerate(keys))
    closing = {
        "valid_to": 's."valid_to"',
        "is_current": "false",
        "_cdc_end_commit_lsn": 's."_cdc_end_commit_lsn"',
        "_cdc_end_lsn": 's."_cdc_end_lsn"',
    }
    meta = ("valid_from", "valid_to", "is_current", "_cdc_op", "_cdc_commit_lsn", "_cdc_lsn", "_cdc_end_commit_lsn",
            "_cdc_end_lsn")  # fmt: skip
    inserted = {c: f's."__c_{j}"' for j, c in enumerate(columns)} | {m: f's."{m}"' for m in meta}
    (
        target.merge(
            source=source,
            predicate=f'{match} AND t."is_current" AND s."__kind" = \'close\'',
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update(updates=closing)
        .when_not_matched_insert(updates=inserted, predicate="s.\"__kind\" = 'insert'")
        .execute()
    )
