"""The stream apply: one Spark application per source applies every table's changes.

``cdc-platform apply --source S`` runs it continuously (a micro-batch whenever a topic has
new records, a short pause when all are idle); ``--once`` applies what is available and
stops (Structured Streaming's ``AvailableNow``, for users who want no long-running Spark).
Both are this one code path, on the session of the platform's PySpark resource.

Per table and micro-batch:

1. **Plan.** The offsets from the recorded changelog frontier (the coverage walk from the
   committed generation's watermark) to the end of the topic, at most
   ``apply.max_offsets_per_batch``, numbered one past the table's last batch, are recorded
   in the ledger (``batches``) *before* anything is written.
2. **Changelog.** The planned offsets are decoded with the table's registered schema
   (cached; one Spark job counts ops, dead letters, unknown columns and positions) and
   appended to the changelog's partition of the day, the batch's identity in the same
   Delta commit (``userMetadata``). A batch re-applied after an interruption is appended
   only if no recent commit carries its identity, and then with Delta's idempotent-write
   options (``txnAppId`` = the table, ``txnVersion`` = the batch number), whose check
   costs a rebuild of the log's state: paid on recovery, not on every batch. Undecodable
   records follow ``errors.tolerance``.
3. **Record.** The batch's ranges join the ledger's changelog ranges: from here on
   coverage, current, the completeness check and the rehydration sensor see them.
4. **Current.** The decoded events are merged straight into current (and history), with
   the same rules as ``lake.current.apply_current`` (``merge_changes``), and current's
   frontier is recorded. When current does not stand exactly at the batch's start (a new
   generation, an interrupted pass, the first pass of a process) ``apply_current`` first
   rebuilds or catches up from the changelog.

Tables are applied side by side (``apply.parallelism``): a small batch's time is mostly
the Spark driver's planning and Delta's commits, which overlap well. In continuous mode
each table runs on its own cadence: a table with a batch goes again as soon as it is
done, so a slow table (a wide history, a big backlog) never holds the others' next batch.

The apply keeps each table's pipeline state (last batch, recorded frontier, current's
position) in memory and reads the ledger only when the process starts, when a table's
generation changes and after a failure, so a pass costs the same on day 300 as on day 1.
That is safe because one process applies a source (``model.leases``): a second one stops
with the holder's identity.

A crash anywhere re-applies the pending batch (planned, not yet recorded) with exactly its
planned offsets; a crash after step 3 leaves current behind its coverage, and the next
process catches it up; the merge ignores changes at or before a row's position, so
applying twice changes nothing. A table's failure stops that table only: retriable errors
retry with backoff, fatal ones (a hole, an incompatible schema, dead letters under
``errors.tolerance: none``) park the table, with the fix in the log, until a new
generation is committed or the process restarts.

After a table's pass, the files its Delta tables replaced more than
``lake.retain_old_files_hours`` ago are deleted, on the table's first pass in the process
and then every ``lake.vacuum_every_minutes`` (``lake.maintenance``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from cdc_platform.config.model import ApplyConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import (
    ChangelogDay,
    DecodedBatch,
    SchemaRefresh,
    WindowResult,
    materialize_batch,
    seal_day,
)
from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.current import (
    CurrentResult,
    apply_current,
    apply_decoded,
    ensure_table_properties,
    forget_columns,
    needs_rebuild,
)
from cdc_platform.lake.errors import classify_spark_error
from cdc_platform.lake.ledger import Ledger, StreamStart
from cdc_platform.lake.maintenance import VacuumCadence, Vacuumed
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import OffsetRange, behind, walk
from cdc_platform.model.errors import CdcError, FatalError, RetriableError
from cdc_platform.model.generations import Generation
from cdc_platform.model.leases import (
    HEARTBEAT_S,
    LEASE_TTL_S,
    LeaseEvent,
    LeaseState,
    describe_scope,
    live_holders,
)
from cdc_platform.model.state import CurrentPosition
from cdc_platform.model.windows import BatchPlan, next_batch_due, next_batch_ranges, window_key, window_start
from cdc_platform.sources.backoff import Backoff

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("cdc_platform.apply")
LEDGER_RETRY_MAX_S = 30.0  # the longest wait between tries of the continuous apply's own ledger calls

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
ONCE_RETRY_BUDGET_S = 120.0  # --once: how long retriable failures are retried before the run fails


@dataclass
class TableApplied:
    """What one pass did for one table."""

    table: str
    batch: str | None = None  # the micro-batch's ledger key, when there was one
    reapplied: bool = False  # it was a pending batch of an earlier, interrupted pass
    offsets: int = 0
    changelog: WindowResult | None = None
    current: CurrentResult | None = None
    sealed: ChangelogDay | None = None  # the changelog's previous day, closed by this pass
    offsets_behind: int | None = None  # Kafka offsets not applied yet, as the pass read the topic (0: caught up)
    catch_up_eta_s: float | None = None  # offsets_behind at the table's rate since its previous batch
    duration_s: float = 0.0
    # the commit time of the batch's oldest change, only when this batch brought every one of
    # its changes to current: merged from the decoded batch, none older than what current held.
    # Not after a rebuild (the batch's changes below the watermark came with the snapshot) nor
    # with a redelivered duplicate (its commit is old, but current had it already): their
    # commit times say nothing about how long a change waited.
    oldest_change_ts: datetime | None = None
    vacuumed: Vacuumed | None = None  # the VACUUM of old files that followed the batch, when one was due

    def oldest_wait_s(self, now: datetime) -> float | None:
        """Commit -> current of the batch's oldest change, its longest wait: what current lagged
        the source by just before the batch committed ("behind the source" is its newest
        change's wait, the least). None without such a batch (``oldest_change_ts``)."""
        oldest = self.oldest_change_ts
        return (now - oldest).total_seconds() if oldest is not None else None


@dataclass
class TableHealth:
    """Whether a table is applied on this pass: retriable failures back off, fatal ones
    park it until a new generation is committed."""

    wait_s: float = RETRY_FIRST_S  # the next retriable failure's pause, doubling to RETRY_MAX_S
    retry_at: float = 0.0
    parked_on: str | None = None  # the committed generation a fatal error happened under
    error: CdcError | None = None

    def ready(self, committed: str | None, now: float) -> bool:
        if self.parked_on is not None:
            if committed == self.parked_on:
                return False
            self.parked_on, self.error = None, None  # a new generation: try again
        return now >= self.retry_at

    def failed(self, error: CdcError, committed: str | None, now: float) -> None:
        self.error = error
        if isinstance(error, FatalError):
            self.parked_on = committed or ""
        else:
            self.retry_at = now + self.wait_s
            self.wait_s = min(self.wait_s * 2, RETRY_MAX_S)

    def succeeded(self) -> None:
        self.error, self.retry_at, self.wait_s = None, 0.0, RETRY_FIRST_S


@dataclass
class TableState:
    """A table's pipeline state as this process knows it (read from the ledger once, then
    kept up to date by its own writes)."""

    generation: str
    recorded: dict[int, int]  # the changelog's frontier: recorded ranges walked from the watermark
    last_batch: BatchPlan | None
    pending: BatchPlan | None  # planned, never recorded: re-applied first
    position: CurrentPosition | None
    current_checked: bool = False  # current confirmed in this process (rebuilt, caught up, or found at the frontier)
    sealed_day: str | None = None  # the last changelog day this process sealed
    offsets_behind: int | None = None  # after this process's last pass of the table
    last_batch_done: float | None = None  # monotonic time this process finished the table's last batch


def load_state(ledger: Ledger, table: LakeTable, committed: Generation, start: StreamStart | None = None) -> TableState:
    """The table's state from the ledger (or from its rows read with other tables'): what a process starts from."""
    assert committed.watermark is not None
    if start is None:
        start = StreamStart(ledger.windows(table.key), ledger.last_batch(table.key), ledger.current(table.key))
    windows, last = start.windows, start.last_batch
    recorded = walk(committed.watermark.kafka_end_offsets, [r.offsets for rs in windows.values() for r in rs])
    pending = last if last is not None and last.key not in windows else None
    if pending is not None and not continues(recorded.frontier, pending):
        # planned before the committed generation (whose watermark is past it): re-reading it
        # would read offsets the generation already holds, or ones retention deleted
        log.info("%s: batch %s, planned before generation %s, abandoned", table.key, pending.key, committed.generation)
        pending = None
    return TableState(committed.generation, recorded.frontier, last, pending, start.current)


def continues(frontier: dict[int, int], plan: BatchPlan) -> bool:
    """The plan reads on from ``frontier`` (every range starts where the frontier stands)."""
    return all(r.start == frontier.get(r.partition, 0) for r in plan.ranges)


class ApplyLease:
    """This process's hold on its tables' apply groups, ``apply:<source>[/<group>]`` (``model.leases``)."""

    def __init__(self, ledger: Ledger, scopes: Sequence[str]) -> None:
        self.ledger, self.scopes = ledger, sorted(set(scopes))
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.holder = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.held = False
        self.beat_at = 0.0

    def acquire(self) -> None:
        taken: list[str] = []
        try:
            for scope in self.scopes:
                self._refuse_if_held(scope)
                self._record(scope, LeaseState.HELD)
                taken.append(scope)
                self._refuse_if_held(scope)  # two starting at once: the first taker keeps it
        except FatalError:  # all or nothing: a refused apply holds none of its groups
            for scope in taken:
                self._record(scope, LeaseState.RELEASED)
            raise
        self.held, self.beat_at = True, time.monotonic()

    def heartbeat(self) -> None:
        if self.held and time.monotonic() - self.beat_at >= HEARTBEAT_S:
            for scope in self.scopes:
                self._record(scope, LeaseState.HELD)
            self.beat_at = time.monotonic()

    def confirm(self) -> None:
        """Still this process's after its heartbeats could not be written: a lease whose
        newest heartbeat is older than the TTL may have been taken by an apply on another
        host (which cannot see this process), and then this one stops, naming it."""
        now = datetime.now(UTC)
        for scope in self.scopes:
            holders = live_holders(self.ledger.leases(scope), now, self._alive, LEASE_TTL_S)
            ours = next((h for h in holders if h.holder == self.holder), None)
            others = [h for h in holders if h.holder != self.holder]
            if others and (ours is None or (now - ours.seen).total_seconds() > LEASE_TTL_S):
                raise FatalError(
                    f"{describe_scope(scope)}: this apply could not renew its lease for over {LEASE_TTL_S:.0f} s "
                    f"and another process took it ({others[0].describe(now)}); this one stops so that one "
                    "process writes the tables",
                    reason="apply_lease_lost",
                )
        self.beat_at = 0.0  # renewed at the next heartbeat

    def release(self) -> None:
        if self.held:
            for scope in self.scopes:
                self._record(scope, LeaseState.RELEASED)
            self.held = False

    def _record(self, scope: str, state: LeaseState) -> None:
        self.ledger.record_lease(LeaseEvent(scope, self.holder, self.host, self.pid, state, datetime.now(UTC)))

    def _refuse_if_held(self, scope: str) -> None:
        now = datetime.now(UTC)
        holders = live_holders(self.ledger.leases(scope), now, self._alive, LEASE_TTL_S)
        first = holders[0] if holders else None
        if first is None or first.holder == self.holder:
            return
        raise FatalError(
            f"{describe_scope(scope)} is already applied by another process ({first.describe(now)}): one stream "
            f"apply per source and apply group. Stop that one first (or, if its host is gone, wait "
            f"{LEASE_TTL_S:.0f} s after its last heartbeat)",
            reason="apply_already_running",
        )

    def _alive(self, host: str, pid: int, taken: datetime) -> bool | None:
        if host != self.host:
            return None
        if pid == self.pid:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        # a SIGKILLed apply leaves its lease held, and the kernel may give its pid to another
        # process (the fault suite saw every restart refused for minutes that way): a process
        # that started after the lease was taken is not the holder; nor is a zombie (an apply
        # killed and not yet reaped: it writes nothing more)
        facts = process_facts(pid)
        return facts is None or (facts.state != "Z" and facts.started <= taken)


@dataclass(frozen=True)
class ProcessFacts:
    state: str  # R, S, D, Z (zombie), ...
    started: datetime


def process_facts(pid: int) -> ProcessFacts | None:
    """Process ``pid``'s state and start, from Linux's /proc (its start in clock ticks since
    boot, and the boot time); None where /proc cannot tell (another OS, a process gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        ticks = int(fields[19])  # field 22 of stat (starttime): fields[0] here is field 3 (the state)
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    # btime is whole seconds, rounded down: the start found is at most a second early, never late
    started = datetime.fromtimestamp(int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK"), UTC)
    return ProcessFacts(fields[0], started)


class StreamApply:
    """Applies the changes of a source's tables: see the module's docstring. Use it as a
    context manager (or call ``close``): it holds the source's lease while it runs."""

    def __init__(
        self,
        spark: SparkSession,
        ledger: Ledger,
        kafka: KafkaClients,
        tables: Sequence[LakeTable],
        settings: ApplyConfig,
        refresh: Callable[[LakeTable], SchemaRefresh | None] = lambda _t: None,
    ) -> None:
        self.spark, self.ledger, self.kafka = spark, ledger, kafka
        self.tables, self.settings, self.refresh = list(tables), settings, refresh
        self.health = {t.key: TableHealth() for t in self.tables}
        self.states: dict[str, TableState] = {}
        self.lease = ApplyLease(ledger, [t.apply_scope for t in self.tables])
        self.vacuums = VacuumCadence()  # old files of each table's Delta tables (lake.vacuum_every_minutes)
        self.pool = ThreadPoolExecutor(max(1, min(settings.tables_at_once(), len(self.tables))), "apply")
        # --once: per table, the end offsets when it started (what "available" means)
        self.until: dict[str, dict[int, int]] | None = None
        # tables' ledger rows read together for a round that starts several (``_read_starts``)
        self.starts: dict[str, StreamStart] = {}

    def __enter__(self) -> StreamApply:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.lease.release()

    # ------------------------------------------------------------ passes

    def run_pass(self) -> list[TableApplied]:
        """One micro-batch (at most) per table, tables side by side; a table's failure is
        logged and kept to it."""
        if not self.lease.held:
            self.lease.acquire()
        self.lease.heartbeat()
        committed = self.ledger.committed_all()
        now = time.monotonic()
        ready = [(t, committed.get(t.key)) for t in self.tables if self._ready(t, committed.get(t.key), now)]
        watermarks = self._round_of(ready)
        results = self.pool.map(lambda item: self._apply_kept(item[0], item[1], watermarks.get(item[0].topic)), ready)
        return [a for a in results if a is not None]

    def _watermarks_of(self, tables: Sequence[LakeTable]) -> dict[str, dict[int, tuple[int, int]]]:
        """Every table's Kafka watermarks in one question (with 200 tables, one per table
        per pass kept the pool's threads waiting on Kafka). If it fails, each table asks on
        its own, and a failure stays that table's (retried with its backoff)."""
        if not tables:
            return {}
        try:
            return self.kafka.watermarks_of([t.topic for t in tables])
        except CdcError as exc:
            log.warning("the Kafka watermarks of %d table(s) failed, each asks on its own: %s", len(tables), exc)
            return {}

    def _round_of(self, ready: Sequence[tuple[LakeTable, Generation | None]]) -> dict[str, dict[int, tuple[int, int]]]:
        """What a round's tables read together before they start: their Kafka watermarks, by topic,
        and the ledger rows of those that load their state."""
        self._read_starts(ready)
        return self._watermarks_of([t for t, _ in ready])

    def _read_starts(self, ready: Sequence[tuple[LakeTable, Generation | None]]) -> None:
        """The ledger rows of every table this round starts (a restart: all of them), read
        together (``Ledger.stream_starts``): read one table at a time, a restart of 40 tables
        behind spent 14 % of its time reading the same ledger tables 40 times over. A failure
        leaves each table to read its own (and fail on its own, with its backoff)."""
        keys = [t.key for t, committed in ready if committed is not None and self._starts(t, committed)]
        if len(keys) < 2:
            return
        try:
            self.starts.update(self.ledger.stream_starts(keys))
        except Exception as exc:
            log.warning("the ledger rows of %d tables not read together, each reads its own: %s", len(keys), exc)

    def _starts(self, table: LakeTable, committed: Generation) -> bool:
        """The table's next batch loads its state from the ledger (``_state``)."""
        state = self.states.get(table.key)
        return committed.watermark is not None and (state is None or state.generation != committed.generation)

    def _apply_kept(
        self, table: LakeTable, committed: Generation | None, watermarks: dict[int, tuple[int, int]] | None
    ) -> TableApplied | None:
        health = self.health[table.key]
        try:
            applied = self.apply_table(table, committed, watermarks)
        except Exception as exc:  # every layer says which kind: classified, then kept to this table
            error = classify_spark_error(exc, f"stream apply of {table.key}")
            health.failed(error, committed.generation if committed else None, time.monotonic())
            self.states.pop(table.key, None)  # read the ledger again before the next try
            forget_columns(table.current_path, table.history_path)  # and the tables' columns
            log.error("%s [%s]: %s", table.key, error.kind, error)
            return None
        health.succeeded()
        vacuumed = self.vacuums.maintain(table)  # after the batch: a due VACUUM never delays the table's changes
        # shown with the batch's report; a VACUUM after a pass with nothing to apply is only logged
        return replace(applied, vacuumed=vacuumed) if applied is not None and vacuumed is not None else applied

    def run_until_caught_up(self) -> list[TableApplied]:
        """Apply everything available when it starts, then stop (the scheduled mode, like
        Structured Streaming's ``AvailableNow``): passes until no table has a batch left up
        to the end offsets read at the start. Raises the first table error, after the
        other tables were applied."""
        applied: list[TableApplied] = []
        self.until = {t.key: self.kafka.end_offsets(t.topic) for t in self.tables}
        try:
            self._passes_until_caught_up(applied)
        finally:
            self.until = None  # later passes of this engine apply whatever is there again
        failed = [(key, h.error) for key, h in self.health.items() if h.error is not None]
        if failed:
            key, error = failed[0]
            assert error is not None
            kind = FatalError if isinstance(error, FatalError) else RetriableError
            raise kind(f"{len(failed)} table(s) failed, first {key}: {error}", reason=error.reason) from error
        return applied

    def _passes_until_caught_up(self, applied: list[TableApplied]) -> None:
        give_up_at = time.monotonic() + ONCE_RETRY_BUDGET_S
        while True:
            batch = [a for a in self.run_pass() if a.batch is not None or a.current is not None]
            applied.extend(batch)
            if any(a.batch is not None for a in batch):
                continue
            retrying = [h.retry_at for h in self.health.values() if h.error is not None and h.parked_on is None]
            if not retrying or min(retrying) > give_up_at:
                return
            time.sleep(max(0.0, min(retrying) - time.monotonic()))  # a retriable failure: back off, try again

    def run_forever(
        self, stop: threading.Event, on_pass: Callable[[list[TableApplied]], None] = lambda _a: None
    ) -> None:
        """Continuous mode: every table on its own cadence, up to ``apply.parallelism`` at
        once. A table that applied a batch goes again as soon as it is done (its next batch
        never waits for a slower table's); one with nothing new waits ``trigger_interval_s``.
        ``on_pass`` gets what each round of completions applied. Until ``stop`` is set; batches
        in flight are finished first."""
        interval, spacing = self.settings.trigger_interval_s, self.settings.min_batch_interval_s
        running: dict[Future[TableApplied | None], str] = {}
        idle_until: dict[str, float] = {}
        started: dict[str, float] = {}  # when each table's last batch started (min_batch_interval_s)
        committed: dict[str, Generation] = {}
        read_at = -float("inf")
        # the process's own ledger reads and writes (its lease, the committed generations) failing,
        # as a store out of reach does: waited out, no new batch meanwhile (batches in flight finish)
        ledger = Backoff(LEDGER_RETRY_MAX_S, None, stop.wait, log)
        while not stop.is_set():
            now = time.monotonic()
            try:
                if ledger.failing_since is not None:  # heartbeats were missed: is the lease still ours?
                    self.lease.confirm()
                if not self.lease.held:
                    self.lease.acquire()
                self.lease.heartbeat()
                if now - read_at >= interval:  # a generation committed meanwhile is seen within one interval
                    committed, read_at = self.ledger.committed_all(), now
                ledger.reset()
            except FatalError:
                raise
            except Exception as exc:
                ledger.failed(RetriableError(f"the ledger could not be read or written: {exc}"))
                continue
            # after the ledger's calls, which take a while on a busy machine or an object store:
            # a batch's spacing counts from when it starts, not from when this round began
            now = time.monotonic()
            busy = set(running.values())
            due = {
                t.key: next_batch_due(idle_until.get(t.key), started.get(t.key), spacing)
                for t in self.tables
                if t.key not in busy
            }
            ready = [
                (table, committed.get(table.key))
                for table in self.tables
                if table.key not in busy and due[table.key] <= now and self._ready(table, committed.get(table.key), now)
            ]
            watermarks = self._round_of(ready)
            for table, generation in ready:
                running[self.pool.submit(self._apply_kept, table, generation, watermarks.get(table.topic))] = table.key
                started[table.key] = time.monotonic()  # after asking Kafka for the watermarks
            # wake for the next table that falls due, and at least once an interval
            wake = max(0.05, min([d for d in due.values() if d > now] + [now + interval]) - now)
            if not running:
                stop.wait(wake)
                continue
            done, _ = wait(running, timeout=wake, return_when=FIRST_COMPLETED)
            on_pass(self._completed(done, running, idle_until))
        wait(running)
        on_pass(self._completed(set(running), running, idle_until))

    def _ready(self, table: LakeTable, committed: Generation | None, now: float) -> bool:
        return self.health[table.key].ready(committed.generation if committed else None, now)

    def _completed(
        self, done: set[Future[TableApplied | None]], running: dict[Future[TableApplied | None], str],
        idle_until: dict[str, float],
    ) -> list[TableApplied]:  # fmt: skip
        applied = []
        for future in done:
            key = running.pop(future)
            result = future.result()
            if result is None or result.batch is None:  # nothing new: look again after the interval
                idle_until[key] = time.monotonic() + self.settings.trigger_interval_s
            if result is not None:
                applied.append(result)
        return applied

    # ------------------------------------------------------------ one table

    def apply_table(
        self, table: LakeTable, committed: Generation | None, watermarks: dict[int, tuple[int, int]] | None = None
    ) -> TableApplied | None:
        """The table's pending or next micro-batch, then current; None when there is nothing to do."""
        if committed is None or committed.watermark is None:
            return None  # no generation yet: the changelog decodes with the schema one registers
        started = time.monotonic()
        state = self._state(table, committed)
        applied = TableApplied(table.key, sealed=self._seal(table, state))
        if not self._current_at(state, state.recorded) and not self._confirm_current(table, state):
            applied.current = self._catch_up(table, state)
        marks = self._available(table, watermarks)
        reapplied = state.pending is not None  # planned by an interrupted pass or process
        batch = state.pending or self._plan(table, committed, state, marks)
        if batch is None:
            state.offsets_behind = applied.offsets_behind = behind(
                state.recorded, {p: h for p, (_, h) in marks.items()}
            )
            done = applied.current is not None or applied.sealed is not None
            return self._finish(applied, started) if done else None
        applied.batch, applied.offsets, applied.reapplied = batch.key, batch.offsets, reapplied
        crash_point("apply.planned")
        decoded = materialize_batch(
            self.spark, self.ledger, table, self.kafka, batch, self.refresh(table), retry=applied.reapplied
        )
        try:
            applied.changelog = decoded.result
            before = state.recorded
            state.recorded = walk(before, batch.ranges).frontier
            state.pending, state.last_batch = None, batch
            crash_point("apply.recorded")
            straight = self._merges_decoded(state, before, batch.ranges)
            held = state.position.applied_position if state.position is not None else None
            merged = self._merge(table, committed, state, decoded, straight)
            applied.current = merged if applied.current is None else _after_catch_up(applied.current, merged)
            if straight and applied.current is not None and not applied.current.rebuilt:
                applied.oldest_change_ts = decoded.summary.min_ts if decoded.summary.newer_than(held) else None
        finally:
            decoded.release()
        state.offsets_behind = applied.offsets_behind = behind(state.recorded, {p: h for p, (_, h) in marks.items()})
        finished = time.monotonic()
        if state.last_batch_done is not None:
            interval = finished - state.last_batch_done
            applied.catch_up_eta_s = catch_up_eta_s(applied.offsets_behind, batch.offsets, interval)
        state.last_batch_done = finished
        return self._finish(applied, started)

    def _merge(
        self, table: LakeTable, committed: Generation, state: TableState, decoded: DecodedBatch, straight: bool
    ) -> CurrentResult:
        """The batch into current: ``straight`` from the decoded rows when current stood at its
        start and the batch continues it (``_merges_decoded``), else by catching up from the changelog."""
        if not straight:
            return self._catch_up(table, state)
        assert state.position is not None  # _merges_decoded
        result = apply_decoded(
            self.spark, self.ledger, table, committed, state.position, decoded.changes(), decoded.summary,
            state.recorded, arrow=decoded.changes_arrow(),
        )  # fmt: skip
        state.position = CurrentPosition(
            result.generation, dict(result.frontier), result.applied_position, result.last_source_ts, result.rows,
            truncated_at=result.truncated_at,
        )  # fmt: skip
        return result

    def _merges_decoded(
        self, state: TableState, batch_start: dict[int, int], batch_ranges: tuple[OffsetRange, ...]
    ) -> bool:
        """Current stands at the batch's start and the batch continues it: its decoded rows
        are merged straight into current."""
        continues = state.position is not None and not walk(state.position.frontier, batch_ranges).holes
        return state.position is not None and continues and self._current_at(state, batch_start)

    def _catch_up(self, table: LakeTable, state: TableState) -> CurrentResult:
        """``apply_current``: rebuilds current from a new generation (or a lost table) and
        applies what the changelog covers beyond current's frontier."""
        result = apply_current(self.spark, self.ledger, table)
        ensure_table_properties(self.spark, table)  # lakes from before deletion vectors and auto compaction
        state.position = self.ledger.current(table.key)
        state.current_checked = True
        return result

    def _confirm_current(self, table: LakeTable, state: TableState) -> bool:
        """A process's first look at a table (a restart, a deploy) whose ledger says current
        stands at the changelog's recorded frontier, of this generation: with current (and
        history) still there (``needs_rebuild``), it is taken as it is. ``apply_current``
        would rebuild nothing and apply nothing, yet count current's rows and record the same
        position again: Spark jobs
        and a ledger commit per table, about 0.6 s of a restart's two threads per idle table
        (docs/benchmarks.md, "Many tables of one source"). The ledger records a position only
        after the merge that reached it committed, so a crash in between leaves it behind the
        frontier, and that table is caught up from the changelog as before."""
        position = state.position
        if position is None or _offsets(position.frontier) != _offsets(state.recorded):
            return False
        if needs_rebuild(table, state.generation, position):
            return False  # another generation, or a table lost: apply_current rebuilds it
        ensure_table_properties(self.spark, table)  # lakes from before deletion vectors and auto compaction
        state.current_checked = True
        return True

    def _seal(self, table: LakeTable, state: TableState) -> ChangelogDay | None:
        """The changelog partition (day, or hour) of the table's last batch, once UTC time has moved past it."""
        last = state.last_batch
        today = stream_partition_now(table)
        if last is None or last.day in (today, state.sealed_day) or state.pending is not None:
            return None
        seal = seal_day(self.spark, self.ledger, table, last.day)
        state.sealed_day = last.day
        if not seal.contiguous:  # fixed offsets cannot overlap or skip; a hole here is a bug to report
            log.error("%s: changelog day %s sealed with holes: %s", table.key, last.day, "; ".join(seal.holes))
        if seal.records_twice:  # appends are idempotent (txnAppId); a record twice is a bug to report
            log.error("%s: changelog day %s sealed with %d record(s) twice", table.key, last.day, seal.records_twice)
        return seal

    def _finish(self, applied: TableApplied, started: float) -> TableApplied:
        applied.duration_s = round(time.monotonic() - started, 3)
        log.info("%s", describe(applied))
        return applied

    def _state(self, table: LakeTable, committed: Generation) -> TableState:
        start = self.starts.pop(table.key, None)  # read for this round only: taken or dropped
        state = self.states.get(table.key)
        if state is None or state.generation != committed.generation:
            state = self.states[table.key] = load_state(self.ledger, table, committed, start)
        return state

    @staticmethod
    def _current_at(state: TableState, frontier: dict[int, int]) -> bool:
        """Current was checked in this process, is of the state's generation and stands at ``frontier``."""
        position = state.position
        return (
            state.current_checked
            and position is not None
            and position.generation == state.generation
            and _offsets(position.frontier) == _offsets(frontier)
        )

    def _available(self, table: LakeTable, watermarks: dict[int, tuple[int, int]] | None) -> dict[int, tuple[int, int]]:
        """Per partition (earliest, end) of what this pass may apply."""
        marks = watermarks if watermarks is not None else self.kafka.watermarks(table.topic)
        if self.until is not None:  # --once applies what was there when it started, not what keeps coming
            ends = self.until.get(table.key, {})
            marks = {p: (low, min(high, ends.get(p, 0))) for p, (low, high) in marks.items()}
        return marks

    def positions(self) -> dict[str, tuple[CurrentPosition, int | None]]:
        """Where current stands per table, as this process last applied it, and how many offsets
        it was behind then: what a reporter shows for tables that had nothing to apply."""
        states = list(self.states.items())  # one atomic copy: worker threads add tables
        return {k: (s.position, s.offsets_behind) for k, s in states if s.position is not None}

    def _plan(
        self, table: LakeTable, committed: Generation, state: TableState, marks: dict[int, tuple[int, int]]
    ) -> BatchPlan | None:
        assert committed.watermark is not None
        ranges = next_batch_ranges(table.key, state.recorded, marks, self.settings.max_offsets_per_batch)
        if not ranges:
            return None
        day = stream_partition_now(table)
        plan = BatchPlan((state.last_batch.number if state.last_batch else 0) + 1, day, ranges)
        self.ledger.plan_batch(table.key, plan)
        state.pending = plan
        return plan


def stream_partition_now(table: LakeTable) -> str:
    """The changelog partition a batch planned now writes to: the UTC day, or hour (``changelog.partition``)."""
    return window_key(window_start(datetime.now(UTC), table.config.changelog.stream_partition_s))


def _after_catch_up(catch_up: CurrentResult, merged: CurrentResult) -> CurrentResult:
    """One pass's result when current was first rebuilt or caught up, then merged a batch."""
    history = merged.history
    if catch_up.history is not None and history is not None:
        history = catch_up.history.plus(history)
    return replace(
        merged,
        rebuilt=catch_up.rebuilt,
        changes_applied=catch_up.changes_applied + merged.changes_applied,
        duration_s=round(catch_up.duration_s + merged.duration_s, 3),
        history=history,
        dropped_by_generation=catch_up.dropped_by_generation,
        dropped_sample=catch_up.dropped_sample,
    )


def _offsets(frontier: dict[int, int]) -> dict[int, int]:
    """A frontier without its zeros (a partition at offset 0 is one nothing was read from)."""
    return {p: o for p, o in frontier.items() if o}


def catch_up_eta_s(offsets_behind: int | None, offsets_applied: int, interval_s: float) -> float | None:
    """Seconds to apply ``offsets_behind`` at the rate of the table's last batch: its offsets
    over the time since the batch before it finished (the table's share of the apply, the
    other tables' batches included). None when the rate or the backlog is unknown."""
    if offsets_behind is None or offsets_applied <= 0 or interval_s <= 0:
        return None
    return round(offsets_behind * interval_s / offsets_applied, 1)


def describe(applied: TableApplied) -> str:
    """One log line: what the batch held and where current stands."""
    parts = [applied.table]
    if applied.batch is not None and applied.changelog is not None:
        again = " (re-applied after an interruption)" if applied.reapplied else ""
        events = ", ".join(f"{op} {n}" for op, n in sorted(applied.changelog.events.items()))
        parts.append(f"batch {applied.batch}{again}: {applied.offsets} offsets ({events or 'no events'})")
        if applied.changelog.dead_letters:
            parts.append(f"{applied.changelog.dead_letters} dead letter(s)")
    if applied.sealed is not None:
        seal = applied.sealed
        parts.append(
            f"changelog day {seal.day} sealed: {seal.batches} batches, {sum(seal.events.values())} events, "
            + ("contiguous" if seal.contiguous else f"HOLES {'; '.join(seal.holes)}")
            + (f", {seal.records_twice} RECORD(S) TWICE" if seal.records_twice else "")
        )
    if applied.current is not None:
        current = applied.current
        now = datetime.now(UTC)
        lag = (now - current.last_source_ts).total_seconds() if current.last_source_ts else None
        waited = applied.oldest_wait_s(now)
        parts.append(
            f"current: {current.changes_applied} change(s) applied, {current.rows} rows"
            + (f", rebuilt from {current.generation}" if current.rebuilt else "")
            + (f", {lag:.1f} s behind the source" if lag is not None else "")
            # "behind" is the newest change's wait, the least of the batch's: the oldest
            # change waited for the batch before this one too (commit -> current, longest)
            + (f", oldest change {waited:.1f} s after its commit" if waited is not None else "")
        )
    if applied.offsets_behind:  # a backlog (a restart after a pause): how much is left, and when it is done
        eta = applied.catch_up_eta_s
        parts.append(f"{applied.offsets_behind} offsets to apply" + (f", about {eta:.0f} s" if eta is not None else ""))
    return "; ".join(parts) + f" [{applied.duration_s:.2f} s]"
