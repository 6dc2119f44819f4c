"""The ledger: every piece of pipeline state, typed, in the lake.

Append-only Delta tables under ``<lake>/_ledger/``, read and written with delta-rs
(no Spark, no JVM: sensors, the CLI and the Spark driver all use the same class):

* ``generations`` — one row per step of a generation's life (requested, running,
  committed, failed) with its reason, cause, run, watermark, rows and resolved schema;
* ``windows`` — changelog offset ranges per window and Kafka partition, fixed once;
* ``current`` — what current has applied (generation, frontier, source position);
* ``schemas`` — the table's registered schema versions (compatibility history, and the
  schema the lake decodes Kafka records with);
* ``feeds`` — readings of the source's rows-written counter and the topic's end offsets
  (``model.feeds``: is the topic fed?);
* ``batches`` — the stream apply's micro-batches, planned before their data is written;
* ``leases`` — who applies a source (``model.leases``: one stream apply per source);
* ``chunks`` — an incremental generation's plan and the chunks it has written
  (``model.chunks``: a generation run again resumes after them);
* ``examined`` — dead letters marked examined, per topic partition
  (``model.dead_letters``: the completeness check counts only the others).

Appends only, so concurrent writers never lose each other (a commit that loses a race,
e.g. two writers creating a table at once, is written again): the state is the fold of the rows
(``model.generations.fold``; the newest ``current`` row; the first recording of a
window). Every ``MAINTAIN_EVERY`` commits a writer compacts the table and checkpoints
its log, so reads stay one file and one checkpoint however long the history.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.delta_rs import commit_exists, read_columns
from cdc_platform.model.chunks import ChunkPlan, ChunkProgress
from cdc_platform.model.coverage import OffsetRange
from cdc_platform.model.dead_letters import ExaminedMark, latest_marks
from cdc_platform.model.errors import RetriableError
from cdc_platform.model.feeds import FeedObservation
from cdc_platform.model.generations import Generation, GenerationEvent, GenerationStatus, Watermark, fold
from cdc_platform.model.leases import LeaseEvent, LeaseState
from cdc_platform.model.state import CurrentPosition, SchemaRecord
from cdc_platform.model.tables import TableSchema
from cdc_platform.model.windows import BatchPlan, WindowPlan, WindowRange

log = logging.getLogger("cdc_platform.ledger")

COMMIT_ATTEMPTS = 8  # with jitter, ~20 s of contention before the run's own retry takes over
COMMIT_RETRY_BASE_S = 0.05

MAINTAIN_EVERY = 100
KEPT_ROWS_MAX = 20_000  # a ledger table's rows kept between reads up to this many (``Ledger._data``)
VACUUM_RETENTION_HOURS = 1
_TS = pa.timestamp("us", tz="UTC")

SCHEMAS: dict[str, pa.Schema] = {
    "generations": pa.schema(
        [
            ("table", pa.string()), ("generation", pa.string()), ("status", pa.string()), ("at", _TS),
            ("reason", pa.string()), ("cause", pa.string()), ("covers", pa.string()), ("run_id", pa.string()),
            ("watermark", pa.string()), ("rows", pa.int64()), ("schema", pa.string()), ("detail", pa.string()),
        ]
    ),
    "windows": pa.schema(
        [
            ("table", pa.string()), ("window", pa.string()), ("window_end", pa.string()), ("partition", pa.int32()),
            ("start", pa.int64()), ("end", pa.int64()), ("recorded_at", _TS),
            # the Kafka records the whole window wrote (changelog rows, tombstones, dead letters), on
            # each of its rows; NULL in a ledger from before it was kept
            ("records", pa.int64()),
        ]
    ),
    "batches": pa.schema(
        [
            ("table", pa.string()), ("batch", pa.int64()), ("day", pa.string()), ("partition", pa.int32()),
            ("start", pa.int64()), ("end", pa.int64()), ("planned_at", _TS),
        ]
    ),
    "current": pa.schema(
        [
            ("table", pa.string()), ("generation", pa.string()), ("frontier", pa.string()),
            ("applied_position", pa.int64()), ("last_source_ts", _TS), ("rows", pa.int64()), ("updated_at", _TS),
            ("truncate_commit", pa.int64()), ("truncate_lsn", pa.int64()),  # added 2026-12-05
        ]
    ),
    "schemas": pa.schema(
        [
            ("table", pa.string()), ("version", pa.int32()), ("generation", pa.string()), ("fingerprint", pa.string()),
            ("schema", pa.string()), ("change", pa.string()), ("registered_at", _TS),
        ]
    ),
    "feeds": pa.schema(
        [("table", pa.string()), ("at", _TS), ("source_changes", pa.int64()), ("topic_end", pa.string())]
    ),
    "leases": pa.schema(
        [("scope", pa.string()), ("holder", pa.string()), ("host", pa.string()), ("pid", pa.int64()),
         ("state", pa.string()), ("at", _TS)]
    ),
    # kind 'plan' (chunk -1, the plan's JSON in ``plan``) or 'written' (one row per chunk)
    "chunks": pa.schema(
        [("table", pa.string()), ("generation", pa.string()), ("kind", pa.string()), ("chunk", pa.int32()),
         ("plan", pa.string()), ("at", _TS)]
    ),
    "examined": pa.schema(
        [("table", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("through_offset", pa.int64()),
         ("at", _TS)]
    ),
}  # fmt: skip


_APPENDING = {name: threading.Lock() for name in SCHEMAS}


@dataclass(frozen=True)
class StreamStart:
    """A table's rows the stream apply starts from (``lake.apply.load_state``)."""

    windows: dict[str, tuple[WindowRange, ...]]  # the changelog's recorded ranges, by window or batch
    last_batch: BatchPlan | None  # the newest planned micro-batch
    current: CurrentPosition | None


@dataclass(frozen=True)
class LedgerState:
    """One read of the whole ledger: what a sensor tick needs for every table at once."""

    generations: dict[str, dict[str, Generation]]  # table -> name -> generation
    windows: dict[str, dict[str, tuple[WindowRange, ...]]]  # table -> window key -> ranges
    current: dict[str, CurrentPosition]

    def committed(self, table: str) -> Generation | None:
        from cdc_platform.model.generations import latest_committed

        return latest_committed(self.generations.get(table, {}).values())


class Ledger:
    def __init__(self, lake_root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = f"{lake_root.rstrip('/')}/_ledger"
        self.storage_options = dict(storage_options or {})
        self._locks = {name: threading.Lock() for name in SCHEMAS}  # a table's handle, one thread at a time
        self._handles: dict[str, Any] = {}  # ledger table -> its delta-rs handle (``_table``)
        self._kept: dict[str, tuple[int, pa.Table]] = {}  # ledger table -> (version, rows) last read

    # ------------------------------------------------------------ generations

    def record_generation(self, event: GenerationEvent) -> None:
        self._append("generations", [_generation_row(event)])

    def generations(self, table: str) -> dict[str, Generation]:
        return fold(_generation_event(r) for r in self._rows("generations", table))

    def committed(self, table: str) -> Generation | None:
        from cdc_platform.model.generations import latest_committed

        return latest_committed(self.generations(table).values())

    # ------------------------------------------------------------ chunked generations

    def plan_chunks(self, table: str, plan: ChunkPlan) -> None:
        now = datetime.now(UTC)
        self._append("chunks", [_chunk_row(table, plan.generation, "plan", -1, plan.to_json(), now)])

    def record_chunks_written(self, table: str, generation: str, chunks: Iterable[int]) -> None:
        now = datetime.now(UTC)
        self._append("chunks", [_chunk_row(table, generation, "written", c, None, now) for c in chunks])

    def chunk_progress(self, table: str, generation: str) -> ChunkProgress:
        """The generation's latest plan and the chunks written under it (a plan made again,
        after the source table's shape changed, starts its progress over)."""
        rows = sorted((r for r in self._rows("chunks", table) if r["generation"] == generation), key=lambda r: r["at"])
        plans = [r for r in rows if r["kind"] == "plan"]
        if not plans:
            return ChunkProgress(None)
        latest = plans[-1]
        written = {int(r["chunk"]) for r in rows if r["kind"] == "written" and r["at"] >= latest["at"]}
        return ChunkProgress(ChunkPlan.from_json(generation, latest["plan"]), frozenset(written))

    # ------------------------------------------------------------ changelog windows

    def record_window(self, table: str, plan: WindowPlan, records: int | None = None) -> None:
        """``plan``'s ranges, fixed once its data is written; ``records``: the Kafka records it
        wrote (changelog rows, tombstones and dead letters), which the day check counts back."""
        now = datetime.now(UTC)
        rows = [
            {"table": table, "window": plan.key, "window_end": r.window_end, "partition": r.partition,
             "start": r.start, "end": r.end, "recorded_at": now, "records": records}
            for r in plan.ranges
        ]  # fmt: skip
        self._append("windows", rows)

    def record_windows(self, table: str, plans: Iterable[WindowPlan]) -> None:
        """Many windows in one commit (imports, tests)."""
        now = datetime.now(UTC)
        rows = [
            {"table": table, "window": p.key, "window_end": r.window_end, "partition": r.partition,
             "start": r.start, "end": r.end, "recorded_at": now}
            for p in plans for r in p.ranges
        ]  # fmt: skip
        self._append("windows", rows)

    def windows(self, table: str) -> dict[str, tuple[WindowRange, ...]]:
        return _windows_of(self._rows("windows", table))

    def windows_with_records(self, table: str) -> tuple[dict[str, tuple[WindowRange, ...]], dict[str, int | None]]:
        """``windows`` and, from the same read, the records each window wrote (None: not
        kept when it was recorded)."""
        first = _first_recordings(self._rows("windows", table))
        return _ranges_of(first), {window: row["records"] for (window, _), row in first.items()}

    # ------------------------------------------------------------ stream batches

    def plan_batch(self, table: str, plan: BatchPlan) -> None:
        """A micro-batch's offsets, recorded before its data is written (the plan a crash re-applies)."""
        now = datetime.now(UTC)
        rows = [
            {"table": table, "batch": plan.number, "day": plan.day, "partition": r.partition, "start": r.start,
             "end": r.end, "planned_at": now}
            for r in plan.ranges
        ]  # fmt: skip
        self._append("batches", rows)

    def batches(self, table: str) -> list[BatchPlan]:
        """The table's planned micro-batches in order, each as first planned (a racing apply's
        second planning of the same number is ignored)."""
        return _plans_of(self._rows("batches", table))

    def last_batch(self, table: str) -> BatchPlan | None:
        """The table's newest planned micro-batch."""
        return _last(self.batches(table))

    # ------------------------------------------------------------ current

    def record_current(self, table: str, position: CurrentPosition) -> None:
        self._append("current", [_current_row(table, position)])

    def current(self, table: str) -> CurrentPosition | None:
        return _latest_position(self._rows("current", table))

    # ------------------------------------------------------------ a stream apply's start

    def stream_starts(self, tables: Iterable[str]) -> dict[str, StreamStart]:
        """What the stream apply starts each of ``tables`` from, in one read of each ledger
        table: a restart asked ``windows``, ``batches`` and ``current`` for each table
        apart, reading every row of every table each time (O(tables x ledger), growing with
        the ledger's history)."""
        wanted = sorted(set(tables))
        windows, batches, current = (self._rows_of(name, wanted) for name in ("windows", "batches", "current"))
        return {
            t: StreamStart(
                _windows_of(windows.get(t, [])), _last(_plans_of(batches.get(t, []))),
                _latest_position(current.get(t, [])),
            )
            for t in wanted
        }  # fmt: skip

    def _rows_of(self, name: str, tables: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The rows of ``tables`` in the ledger table ``name``, by table."""
        data = self._data(name)
        by_table: dict[str, list[dict[str, Any]]] = {}
        if data is None:
            return by_table
        for row in data.filter(pc.is_in(data["table"], pa.array(tables, pa.string()))).to_pylist():
            by_table.setdefault(row["table"], []).append(row)
        return by_table

    # ------------------------------------------------------------ schemas

    def register_schema(self, table: str, record: SchemaRecord) -> None:
        row = {
            "table": table, "version": record.version, "generation": record.generation,
            "fingerprint": record.fingerprint, "schema": record.schema_json, "change": record.change,
            "registered_at": record.registered_at,
        }  # fmt: skip
        self._append("schemas", [row])

    def schema_history(self, table: str) -> list[SchemaRecord]:
        rows = sorted(self._rows("schemas", table), key=lambda r: (r["version"], r["registered_at"]))
        latest: dict[int, SchemaRecord] = {}
        for r in rows:  # a version registered twice (a retried step) keeps its first record
            latest.setdefault(
                r["version"],
                SchemaRecord(
                    r["version"], r["generation"], r["fingerprint"], r["schema"], r["change"], r["registered_at"]
                ),
            )
        return [latest[v] for v in sorted(latest)]

    def latest_schema(self, table: str) -> TableSchema | None:
        history = self.schema_history(table)
        return TableSchema.from_json(history[-1].schema_json) if history else None

    # ------------------------------------------------------------ feeds

    def record_feed(self, table: str, observation: FeedObservation) -> None:
        """Only readings the producer confirmed: they are what the next one is judged against."""
        assert observation.confirmed
        row = {
            "table": table, "at": observation.at, "source_changes": observation.source_changes,
            "topic_end": json.dumps({str(p): o for p, o in observation.topic_end.items()}),
        }  # fmt: skip
        self._append("feeds", [row])

    def last_feed(self, table: str) -> FeedObservation | None:
        rows = self._rows("feeds", table)
        if not rows:
            return None
        row = max(rows, key=lambda r: r["at"])
        ends = {int(p): int(o) for p, o in json.loads(row["topic_end"]).items()}
        return FeedObservation(row["at"], int(row["source_changes"]), ends, confirmed=True)

    # ------------------------------------------------------------ dead letters examined

    def mark_dead_letters_examined(self, table: str, marks: Iterable[ExaminedMark]) -> None:
        rows = [
            {"table": table, "topic": m.topic, "partition": m.partition, "through_offset": m.through_offset, "at": m.at}
            for m in marks
        ]  # fmt: skip
        self._append("examined", rows)

    def dead_letters_examined(self, table: str) -> dict[tuple[str, int], ExaminedMark]:
        """Each topic partition's newest mark."""
        return latest_marks(
            ExaminedMark(r["topic"], int(r["partition"]), int(r["through_offset"]), r["at"])
            for r in self._rows("examined", table)
        )

    # ------------------------------------------------------------ leases

    def record_lease(self, event: LeaseEvent) -> None:
        row = {
            "scope": event.scope, "holder": event.holder, "host": event.host, "pid": event.pid,
            "state": event.state.value, "at": event.at,
        }  # fmt: skip
        self._append("leases", [row])

    def leases(self, scope: str) -> list[LeaseEvent]:
        data = self._data("leases")
        if data is None:
            return []
        rows = data.filter(pc.equal(data["scope"], scope)).to_pylist()
        return [
            LeaseEvent(r["scope"], r["holder"], r["host"], int(r["pid"]), LeaseState(r["state"]), r["at"]) for r in rows
        ]

    # ------------------------------------------------------------ everything at once

    def committed_all(self) -> dict[str, Generation]:
        """Every table's latest committed generation, from one read (a stream apply's pass)."""
        from cdc_platform.model.generations import latest_committed

        events: dict[str, list[GenerationEvent]] = {}
        for row in self._rows("generations"):
            events.setdefault(row["table"], []).append(_generation_event(row))
        committed = {t: latest_committed(fold(e).values()) for t, e in events.items()}
        return {t: g for t, g in committed.items() if g is not None}

    def read(self) -> LedgerState:
        generations: dict[str, list[GenerationEvent]] = {}
        for row in self._rows("generations"):
            generations.setdefault(row["table"], []).append(_generation_event(row))
        windows: dict[str, list[dict[str, Any]]] = {}
        for row in self._rows("windows"):
            windows.setdefault(row["table"], []).append(row)
        current: dict[str, dict[str, Any]] = {}
        for row in self._rows("current"):
            if row["table"] not in current or row["updated_at"] > current[row["table"]]["updated_at"]:
                current[row["table"]] = row
        return LedgerState(
            {t: fold(events) for t, events in generations.items()},
            {t: _windows_of(rows) for t, rows in windows.items()},
            {t: _current_position(r) for t, r in current.items()},
        )

    # ------------------------------------------------------------ storage

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _table(self, name: str) -> Any:
        """The ledger table's handle, at its newest version; None when never written. The
        caller holds ``self._locks[name]``. One handle per table and process, brought up to
        date from the log's new commits: opening a table reads its checkpoint and every
        commit since (up to ``MAINTAIN_EVERY``), 9-37 ms each time, and every read and
        commit opened it anew (docs/benchmarks.md, "Stop 76")."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        handle = self._handles.get(name)
        try:
            if handle is not None and self._still_there(name, handle):
                return handle
            handle = self._handles[name] = DeltaTable(self._path(name), storage_options=self.storage_options or None)
            return handle
        except TableNotFoundError:
            self._handles.pop(name, None)
            return None
        except OSError as exc:
            self._handles.pop(name, None)
            raise RetriableError(f"ledger {self._path(name)} cannot be read: {exc}") from None

    def _still_there(self, name: str, handle: Any) -> bool:
        """The kept handle brought to the table's newest version, or False when the table it
        named is gone (deleted, or written anew in its place: its new commits would land on the
        old state). The version's commit is looked for after the update: the log keeps it."""
        try:
            handle.update_incremental()
            if commit_exists(self._path(name), handle.version()):
                return True
        except Exception as exc:  # opened again below, which says what is wrong if anything is
            log.info("ledger %s: its kept handle failed (%s), opened again", name, exc)
        self._handles.pop(name, None)
        self._kept.pop(name, None)
        return False

    def _data(self, name: str) -> pa.Table | None:
        """Every row of the ledger table (None: never written). A table that has not moved
        since this process last read it is not read again: the stream apply reads the
        schemas and generations every batch or pass, and they change once a generation."""
        with self._locks[name]:
            delta = self._table(name)
            if delta is None:
                return None
            version = delta.version()
            kept = self._kept.get(name)
            if kept is not None and kept[0] == version:
                return kept[1]
            data = _read(delta, SCHEMAS[name])
            if data.num_rows <= KEPT_ROWS_MAX:
                self._kept[name] = (version, data)
            else:  # a table this big is read on starts only: not worth its memory
                self._kept.pop(name, None)
            return data

    def _rows(self, name: str, table: str | None = None) -> list[dict[str, Any]]:
        data = self._data(name)
        if data is None:
            return []
        if table is not None:
            data = data.filter(pc.equal(data["table"], table))
        rows: list[dict[str, Any]] = data.to_pylist()
        return rows

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        data = pa.Table.from_pylist(rows, schema=SCHEMAS[name])
        # threads of one process (a stream apply's tables) take turns, not retries
        with _APPENDING[name], self._locks[name]:
            self._maintain(name, self._commit(name, data))

    def _commit(self, name: str, data: pa.Table) -> Any:
        """Appends ``data``; returns the table's handle at the version this commit made (a
        write through a handle moves it there: reading the log again for that would cost a
        listing and a lookup per record, ~10 ms each on an object store, a quarter of an append)."""
        import deltalake
        from deltalake.exceptions import CommitFailedError

        for attempt in range(COMMIT_ATTEMPTS):
            try:
                delta = self._table(name)
                deltalake.write_deltalake(  # merge: a ledger written before a column was added gains it
                    delta if delta is not None else self._path(name), data, mode="append", schema_mode="merge",
                    storage_options=self.storage_options or None,
                )  # fmt: skip
                return delta if delta is not None else self._table(name)  # the write created the table
            except CommitFailedError as exc:
                # another writer committed first (two creating the table at once, or a
                # compaction): nothing of ours landed, so writing again is safe
                log.info("ledger %s: commit lost to another writer (%s), retrying", name, exc)
                time.sleep(COMMIT_RETRY_BASE_S * 2**attempt * (1 + random.random()))  # noqa: S311 (jitter, not a secret)
            except OSError as exc:
                raise RetriableError(f"ledger {self._path(name)} cannot be written: {exc}") from None
        raise RetriableError(
            f"ledger {self._path(name)}: lost {COMMIT_ATTEMPTS} commits in a row to other writers; "
            "the run retries (many writers on one ledger table at once? check for runaway runs)"
        )

    def _maintain(self, name: str, delta: Any) -> None:
        """Every MAINTAIN_EVERY commits: one file, a checkpoint, old files removed. ``delta``:
        the handle at the version the caller's commit made."""
        if delta is None or delta.version() % MAINTAIN_EVERY != 0:
            return
        try:
            delta.optimize.compact()
            delta.create_checkpoint()
            delta.vacuum(VACUUM_RETENTION_HOURS, dry_run=False, enforce_retention_duration=False)
        except Exception as exc:  # maintenance is best effort; the next writer tries again
            log.warning("ledger %s: maintenance skipped (%s)", name, exc)


def _read(delta: Any, schema: pa.Schema) -> pa.Table:
    """Every row in ``schema``; a column a ledger written before it was added reads as NULL."""
    present = {f.name for f in delta.schema().fields}
    data = read_columns(delta, [n for n in schema.names if n in present])
    for name in schema.names:
        if name not in present:
            data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
    return data.select(schema.names).cast(schema)


def _generation_row(event: GenerationEvent) -> dict[str, Any]:
    return {
        "table": event.table, "generation": event.generation, "status": event.status.value, "at": event.at,
        "reason": event.reason, "cause": event.cause, "covers": json.dumps(list(event.covers)), "run_id": event.run_id,
        "watermark": event.watermark.to_json() if event.watermark else None, "rows": event.rows,
        "schema": event.schema_json, "detail": event.detail,
    }  # fmt: skip


def _generation_event(row: dict[str, Any]) -> GenerationEvent:
    return GenerationEvent(
        table=row["table"],
        generation=row["generation"],
        status=GenerationStatus(row["status"]),
        at=row["at"],
        reason=row["reason"] or "",
        cause=row["cause"] or "",
        covers=tuple(json.loads(row["covers"] or "[]")),
        run_id=row["run_id"] or "",
        watermark=Watermark.from_json(row["watermark"]) if row["watermark"] else None,
        rows=row["rows"],
        schema_json=row["schema"] or "",
        detail=row["detail"] or "",
    )


def _chunk_row(table: str, generation: str, kind: str, chunk: int, plan: str | None, at: datetime) -> dict[str, Any]:
    return {"table": table, "generation": generation, "kind": kind, "chunk": chunk, "plan": plan, "at": at}


def _windows_of(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[WindowRange, ...]]:
    """Window key -> its ranges; a window recorded twice (a race) keeps its first recording."""
    return _ranges_of(_first_recordings(rows))


def _first_recordings(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(window, partition) -> its row of the window's first recording (a race records twice)."""
    first: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        slot = (row["window"], row["partition"])
        if slot not in first or row["recorded_at"] < first[slot]["recorded_at"]:
            first[slot] = row
    return first


def _ranges_of(first: dict[tuple[str, int], dict[str, Any]]) -> dict[str, tuple[WindowRange, ...]]:
    out: dict[str, list[WindowRange]] = {}
    for (window, partition), row in sorted(first.items()):
        out.setdefault(window, []).append(WindowRange(partition, row["start"], row["end"], row["window_end"]))
    return {k: tuple(v) for k, v in out.items()}


def _plans_of(rows: Iterable[dict[str, Any]]) -> list[BatchPlan]:
    by_number: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_number.setdefault(row["batch"], []).append(row)
    plans = []
    for number, planned in sorted(by_number.items()):
        first = min(r["planned_at"] for r in planned)
        ranges = sorted(OffsetRange(r["partition"], r["start"], r["end"]) for r in planned if r["planned_at"] == first)
        plans.append(BatchPlan(number, planned[0]["day"], tuple(ranges)))
    return plans


def _last(plans: list[BatchPlan]) -> BatchPlan | None:
    return plans[-1] if plans else None


def _latest_position(rows: list[dict[str, Any]]) -> CurrentPosition | None:
    return _current_position(max(rows, key=lambda r: r["updated_at"])) if rows else None


def _current_row(table: str, position: CurrentPosition) -> dict[str, Any]:
    return {
        "table": table, "generation": position.generation,
        "frontier": json.dumps({str(p): o for p, o in sorted(position.frontier.items())}),
        "applied_position": position.applied_position, "last_source_ts": position.last_source_ts,
        "rows": position.rows, "updated_at": position.updated_at,
        "truncate_commit": position.truncated_at[0] if position.truncated_at else None,
        "truncate_lsn": position.truncated_at[1] if position.truncated_at else None,
    }  # fmt: skip


def _current_position(row: dict[str, Any]) -> CurrentPosition:
    return CurrentPosition(
        generation=row["generation"],
        frontier={int(p): int(o) for p, o in json.loads(row["frontier"]).items()},
        applied_position=int(row["applied_position"]),
        last_source_ts=row["last_source_ts"],
        rows=int(row["rows"] or 0),
        updated_at=row["updated_at"],
        truncated_at=(row["truncate_commit"], row["truncate_lsn"]) if row["truncate_commit"] is not None else None,
    )
