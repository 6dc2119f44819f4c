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
2. **Changelog.** The planned offsets are decoded with the table's registered schema and
   appended to the changelog's partition of the day under Delta's idempotent-write
   options (``txnAppId`` = the table, ``txnVersion`` = the batch number): a re-run of the
   batch writes nothing twice. Undecodable records follow ``errors.tolerance``.
3. **Record.** The batch's ranges join the ledger's changelog ranges: from here on
   coverage, current, the completeness check and the rehydration sensor see them.
4. **Current.** ``lake.current.apply_current`` merges the newly covered offsets into
   current (and history) and records its frontier: the same merge a Dagster run makes.

A crash anywhere re-applies the pending batch (planned, not yet recorded) with exactly its
planned offsets; a crash after step 3 leaves current behind its coverage, and the next
pass applies it; the merge ignores changes at or before a row's position, so applying
twice changes nothing. A table's failure stops that table only: retriable errors retry
with backoff, fatal ones (a hole, an incompatible schema, dead letters under
``errors.tolerance: none``) park the table, with the fix in the log, until a new
generation is committed or the process restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc_platform.config.model import ApplyConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import SchemaRefresh, WindowResult, materialize_batch
from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.current import CurrentResult, apply_current
from cdc_platform.lake.errors import classify_spark_error
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import walk
from cdc_platform.model.errors import CdcError, FatalError, RetriableError
from cdc_platform.model.generations import Generation
from cdc_platform.model.windows import DAY_S, BatchPlan, WindowRange, next_batch_ranges, window_key, window_start

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("cdc_platform.apply")

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
    duration_s: float = 0.0


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


class StreamApply:
    """Applies the changes of a source's tables: see the module's docstring."""

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
        # --once: per table, the end offsets when it started (what "available" means)
        self.until: dict[str, dict[int, int]] | None = None

    # ------------------------------------------------------------ passes

    def run_pass(self) -> list[TableApplied]:
        """One micro-batch (at most) per table; a table's failure is logged and kept to it."""
        done = []
        for table in self.tables:
            committed = self.ledger.committed(table.key)
            health = self.health[table.key]
            if not health.ready(committed.generation if committed else None, time.monotonic()):
                continue
            try:
                applied = self.apply_table(table, committed)
            except Exception as exc:  # every layer says which kind: classified, then kept to this table
                error = classify_spark_error(exc, f"stream apply of {table.key}")
                health.failed(error, committed.generation if committed else None, time.monotonic())
                log.error("%s [%s]: %s", table.key, error.kind, error)
                continue
            health.succeeded()
            if applied is not None:
                done.append(applied)
        return done

    def run_until_caught_up(self) -> list[TableApplied]:
        """Apply everything available when it starts, then stop (the scheduled mode, like
        Structured Streaming's ``AvailableNow``): passes until no table has a batch left up
        to the end offsets read at the start. Raises the first table error, after the
        other tables were applied."""
        applied: list[TableApplied] = []
        self.until = {t.key: self.kafka.end_offsets(t.topic) for t in self.tables}
        give_up_at = time.monotonic() + ONCE_RETRY_BUDGET_S
        while True:
            batch = [a for a in self.run_pass() if a.batch is not None or a.current is not None]
            applied.extend(batch)
            if any(a.batch is not None for a in batch):
                continue
            retrying = [h.retry_at for h in self.health.values() if h.error is not None and h.parked_on is None]
            if not retrying or min(retrying) > give_up_at:
                break
            time.sleep(max(0.0, min(retrying) - time.monotonic()))  # a retriable failure: back off, try again
        failed = [(key, h.error) for key, h in self.health.items() if h.error is not None]
        if failed:
            key, error = failed[0]
            assert error is not None
            kind = FatalError if isinstance(error, FatalError) else RetriableError
            raise kind(f"{len(failed)} table(s) failed, first {key}: {error}", reason=error.reason) from error
        return applied

    def run_forever(
        self, stop: threading.Event, on_pass: Callable[[list[TableApplied]], None] = lambda _a: None
    ) -> None:
        """Continuous mode: a pass whenever a topic has new records, a pause of
        ``trigger_interval_s`` when every table is idle, until ``stop`` is set."""
        while not stop.is_set():
            applied = self.run_pass()
            on_pass(applied)
            if not any(a.batch is not None for a in applied):
                stop.wait(self.settings.trigger_interval_s)

    # ------------------------------------------------------------ one table

    def apply_table(self, table: LakeTable, committed: Generation | None) -> TableApplied | None:
        """The table's pending or next micro-batch, then current; None when there is nothing to do."""
        if committed is None or committed.watermark is None:
            return None  # no generation yet: the changelog decodes with the schema one registers
        started = time.monotonic()
        windows = self.ledger.windows(table.key)
        pending = self._pending(table, windows)
        batch = pending or self._plan(table, committed, windows)
        applied = TableApplied(table.key, reapplied=pending is not None)
        if batch is not None:
            crash_point("apply.planned")
            applied.batch, applied.offsets = batch.key, batch.offsets
            applied.changelog = materialize_batch(
                self.spark, self.ledger, table, self.kafka, batch, self.refresh(table)
            )
            windows = {**windows, batch.key: batch.as_window(reused=False).ranges}
            crash_point("apply.recorded")
        if batch is None and not self._current_behind(table, committed, windows):
            return None
        applied.current = apply_current(self.spark, self.ledger, table)
        applied.duration_s = round(time.monotonic() - started, 3)
        log.info("%s", describe(applied))
        return applied

    def _pending(self, table: LakeTable, windows: dict[str, tuple[WindowRange, ...]]) -> BatchPlan | None:
        """The last planned batch, when its ranges were never recorded (a pass was interrupted)."""
        last = self.ledger.last_batch(table.key)
        return last if last is not None and last.key not in windows else None

    def _plan(
        self, table: LakeTable, committed: Generation, windows: dict[str, tuple[WindowRange, ...]]
    ) -> BatchPlan | None:
        assert committed.watermark is not None
        recorded = walk(committed.watermark.kafka_end_offsets, [r.offsets for rs in windows.values() for r in rs])
        watermarks = self.kafka.watermarks(table.topic)
        if self.until is not None:  # --once applies what was there when it started, not what keeps coming
            ends = self.until.get(table.key, {})
            watermarks = {p: (low, min(high, ends.get(p, 0))) for p, (low, high) in watermarks.items()}
        ranges = next_batch_ranges(table.key, recorded.frontier, watermarks, self.settings.max_offsets_per_batch)
        if not ranges:
            return None
        last = self.ledger.last_batch(table.key)
        day = window_key(window_start(datetime.now(UTC), DAY_S))
        self.ledger.plan_batch(table.key, BatchPlan((last.number if last else 0) + 1, day, ranges))
        # the ledger's first planning wins: two applies racing on one table act on one plan
        return self.ledger.last_batch(table.key)

    def _current_behind(
        self, table: LakeTable, committed: Generation, windows: dict[str, tuple[WindowRange, ...]]
    ) -> bool:
        """Current has not applied what the changelog covers (an interrupted pass), or is
        from an older generation."""
        position = self.ledger.current(table.key)
        if position is None or position.generation != committed.generation:
            return True
        covered = walk(position.frontier, [r.offsets for rs in windows.values() for r in rs])
        return covered.frontier != position.frontier


def describe(applied: TableApplied) -> str:
    """One log line: what the batch held and where current stands."""
    parts = [applied.table]
    if applied.batch is not None and applied.changelog is not None:
        again = " (re-applied after an interruption)" if applied.reapplied else ""
        events = ", ".join(f"{op} {n}" for op, n in sorted(applied.changelog.events.items()))
        parts.append(f"batch {applied.batch}{again}: {applied.offsets} offsets ({events or 'no events'})")
        if applied.changelog.dead_letters:
            parts.append(f"{applied.changelog.dead_letters} dead letter(s)")
    if applied.current is not None:
        current = applied.current
        lag = (datetime.now(UTC) - current.last_source_ts).total_seconds() if current.last_source_ts else None
        parts.append(
            f"current: {current.changes_applied} change(s) applied, {current.rows} rows"
            + (f", rebuilt from {current.generation}" if current.rebuilt else "")
            + (f", {lag:.1f} s behind the source" if lag is not None else "")
        )
    return "; ".join(parts) + f" [{applied.duration_s:.2f} s]"
