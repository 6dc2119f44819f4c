"""What a running stream apply tells Dagster: runless events, throttled, so the UI shows
every table's state without a run per micro-batch and without an event log that explodes.

* **current (and history)**: *observations* with frontier, applied position, rows,
  changes applied since the last report, offsets behind, freshness lag and, with a
  backlog, when it is expected to be applied; at most once a minute per table while it
  applies, at once after a rebuild, and every two minutes for a table that had nothing to
  apply. With each, current's ``fresh`` check: within ``checks.fresh_within_s`` of the source, or
  caught up, and no change applied since the last report waited longer than that from its
  commit to current (the batches' oldest changes); a table back within reach after a report
  that was behind is reported at once.
  Each also says how many batches were too big for the driver since the last report
  (``too_big_for_driver``), and while such a table's batches go through Spark's jobs and
  MERGE, that they do.
  Observations, not materializations: Dagster counts a check's result only for the
  materialization it followed, so materializations every minute hid every check result
  of the 10-minute runs (the asset showed "0 / 4 Passed", a failure vanished within a
  minute, and ``all_deps_blocking_checks_passed`` never held for a downstream asset).
  Current is materialized by the run that checks it;
* **changelog**: the day's partition (created when the apply writes its first batch),
  with the offsets, batches, events by op and dead letters of the day so far, at most
  once a minute per table; when the UTC day is over, the sealed day at once (its ranges
  fixed and checked contiguous), with its ``every_offset_once`` check on that partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.lake import driver_batch
from cdc_platform.lake.apply import TableApplied
from cdc_platform.lake.changelog import ChangelogDay
from cdc_platform.lake.current import CurrentResult
from cdc_platform.lake.maintenance import Vacuumed
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.state import CurrentPosition
from cdc_platform.model.windows import changelog_partition
from cdc_platform.orchestration.keys import (
    DAY_CHECK,
    FRESH_CHECK,
    changelog_asset_key,
    current_asset_key,
    history_asset_key,
)
from cdc_platform.orchestration.metadata import (
    catch_up_metadata,
    changelog_day_metadata,
    current_metadata,
    day_check_metadata,
    day_check_outcome,
    fresh_check_description,
    fresh_check_metadata,
    history_metadata,
    is_fresh,
    vacuum_metadata,
)
from cdc_platform.orchestration.partitions import changelog_days_partitions, day_partition_key
from cdc_platform.sources.base import CaptureSilence

log = logging.getLogger("cdc_platform.apply")


def _add_vacuum(since: dict[str, Vacuumed], item: TableApplied) -> None:
    """``item``'s VACUUM, if it ran one, added to its table's VACUUMs ``since`` the last report."""
    if item.vacuumed is not None:
        earlier = since.get(item.table)
        since[item.table] = earlier.then(item.vacuumed) if earlier else item.vacuumed


REPORT_EVERY_S = 60.0  # at most one report per table and asset per minute
IDLE_REPORT_EVERY_S = 120.0  # a table with nothing to apply: its position (and fresh check)

# per table: where current stands and how many offsets it was behind (StreamApply.positions)
Positions = Callable[[], Mapping[str, tuple[CurrentPosition, int | None]]]


class RunlessReporter:
    """Reports each table's current and changelog day as the stream apply moves them."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        tables: Sequence[LakeTable],
        position: Callable[[int], str],
        every_s: float = REPORT_EVERY_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        positions: Positions = dict,
        idle_every_s: float = IDLE_REPORT_EVERY_S,
        formats: Mapping[str, Callable[[int], str]] | None = None,
        emit: Callable[[dg.AssetMaterialization | dg.AssetObservation], None] | None = None,
        capture: Callable[[TableConfig], CaptureSilence | None] = lambda _table: None,
    ) -> None:
        """``position`` formats source positions (LSNs, a polled database's clock); ``formats``
        overrides it per source when one apply applies several. ``emit``: where events go
        (default: runless events of ``instance``; a Dagster run passes its own log).
        ``capture``: how long a table's capture has been silent (``sources.base.CaptureWatch``),
        so a table caught up with Kafka while nothing captures the source is not reported fresh."""
        self.instance, self.position, self.every_s, self.clock = instance, position, every_s, clock
        self.formats = dict(formats or {})
        self.emit = emit or instance.report_runless_asset_event
        # check evaluations are runless events in both modes (a scheduled run's log takes its asset events)
        self.emit_check: Callable[[dg.AssetCheckEvaluation], None] = instance.report_runless_asset_event
        self.positions, self.idle_every_s, self.capture = positions, idle_every_s, capture
        self.tables = {t.key: t for t in tables}
        self.last: dict[str, float] = {}  # per table: the last report of current
        self.behind: set[str] = set()  # tables whose last report was further behind than their fresh_within_s
        self.last_day: dict[str, float] = {}  # per table: the last report of its changelog day
        self.changes_since: dict[str, int] = {}
        self.waited_since: dict[str, float] = {}  # per table: the longest commit -> current since the last report
        self.vacuumed_since: dict[str, Vacuumed] = {}  # per table: the VACUUMs of old files since the last report
        self.days: dict[str, ChangelogDay] = {}  # per table: the day being filled
        self.partitions: set[tuple[str, str]] = set()  # (partitions definition, key) known to exist
        self.refused_seen: dict[str, int] = {}  # per table: driver_batch.refused at its last report

    def __call__(self, applied: Sequence[TableApplied]) -> None:
        for item in applied:
            if item.table not in self.tables:
                continue
            try:
                self._changelog(item)
                self._current(item)
            except Exception as exc:  # the lake is what matters; the UI catches up on the next report
                log.warning("%s: could not report to Dagster (%s); applying goes on", item.table, exc)
        self._idle({item.table for item in applied})

    # ------------------------------------------------------------ current

    def _current(self, item: TableApplied) -> None:
        if item.current is None:
            return
        key = item.table
        self.changes_since[key] = self.changes_since.get(key, 0) + item.current.changes_applied
        waited = item.oldest_wait_s(datetime.now(UTC))
        if waited is not None:
            self.waited_since[key] = max(waited, self.waited_since.get(key, 0.0))
        _add_vacuum(self.vacuumed_since, item)
        now = self.clock()
        due = item.current.rebuilt or now - self.last.get(key, -float("inf")) >= self.every_s
        # back within reach of the source after a report that was behind: at once, so the
        # fresh check turns green when current does, not a throttle period later
        within_s = self.tables[key].config.checks.fresh_within_s
        caught_up = key in self.behind and is_fresh(
            item.current, item.offsets_behind, within_s, waited, self.capture(self.tables[key].config)
        )
        if not (due or caught_up):
            return
        changes = self.changes_since.pop(key)
        # back within reach: this batch's wait is the news, not the backlog's before it
        waited_since = waited if caught_up and not due else self.waited_since.get(key)
        self.waited_since.pop(key, None)
        self._report_current(
            key, item.current, changes, item.offsets_behind, item.catch_up_eta_s, waited_since,
            self.vacuumed_since.pop(key, None),
        )  # fmt: skip
        self.last[key] = now

    def _idle(self, reported: set[str]) -> None:
        """Tables this pass did not touch: their last known position, every ``idle_every_s``."""
        now = self.clock()
        due = [
            k for k in self.tables if k not in reported and now - self.last.get(k, -float("inf")) >= self.idle_every_s
        ]
        if not due:
            return
        positions = self.positions()
        for key in due:
            if key not in positions:
                continue
            try:
                self._report_position(key, *positions[key])
            except Exception as exc:
                log.warning("%s: could not report to Dagster (%s); applying goes on", key, exc)
            self.last[key] = now

    def _report_position(self, key: str, position: CurrentPosition, offsets_behind: int | None) -> None:
        """Current where the apply last left it, for a table with nothing new to apply."""
        result = CurrentResult(
            position.generation, False, 0, position.rows, dict(position.frontier), position.applied_position,
            position.last_source_ts, 0.0,
        )  # fmt: skip
        self._report_current(key, result, self.changes_since.pop(key, 0), offsets_behind)

    def _report_current(
        self, key: str, result: CurrentResult, changes: int, offsets_behind: int | None, eta_s: float | None = None,
        waited_s: float | None = None, vacuumed: Vacuumed | None = None,
    ) -> None:  # fmt: skip
        """``waited_s``: the longest commit -> current of the changes applied since the last report;
        ``vacuumed``: the VACUUMs of old files since then."""
        config = self.tables[key].config
        capture = self.capture(config)
        metadata = {
            **current_metadata(result, self.formats.get(config.source, self.position), offsets_behind, capture),
            # everything applied since the last report (the throttle folds micro-batches)
            "changes_applied": dg.MetadataValue.int(changes),
            "engine": dg.MetadataValue.text("stream"),
            **catch_up_metadata(offsets_behind, eta_s),
        }
        if waited_s is not None:  # the changes' longest commit -> current since the last report
            metadata["longest_wait_s"] = dg.MetadataValue.float(round(waited_s, 1))
        if vacuumed is not None:
            metadata.update(vacuum_metadata(vacuumed))
        metadata.update(self._driver_metadata(key))
        self.emit(dg.AssetObservation(asset_key=current_asset_key(config), metadata=metadata))
        if result.history is not None:
            self.emit(dg.AssetObservation(asset_key=history_asset_key(config), metadata=history_metadata(result)))
        within_s = config.checks.fresh_within_s
        fresh = is_fresh(result, offsets_behind, within_s, waited_s, capture)
        (self.behind.discard if fresh else self.behind.add)(key)
        self.emit_check(
            dg.AssetCheckEvaluation(
                asset_key=current_asset_key(config), check_name=FRESH_CHECK, passed=fresh,
                metadata=fresh_check_metadata(result, offsets_behind, within_s, eta_s, waited_s, capture),
                description=fresh_check_description(
                    result, offsets_behind, within_s, config.source, waited_s, capture
                ),
            )
        )  # fmt: skip

    def _driver_metadata(self, key: str) -> dict[str, dg.MetadataValue]:
        """Batches too big for the driver since the last report (plotted: 0 when none), and
        while the table's batches go through Spark because of one, that it is so: otherwise
        only a warning in the apply's log says why the table got slower."""
        table = self.tables[key]
        refused = driver_batch.refused(table)
        metadata: dict[str, dg.MetadataValue] = {
            "too_big_for_driver": dg.MetadataValue.int(refused - self.refused_seen.get(key, 0))
        }
        self.refused_seen[key] = refused
        if driver_batch.recently_too_big(table):
            metadata["batches_through"] = dg.MetadataValue.text(
                "Spark's jobs and MERGE: a batch was too big for the driver (see the apply's log)"
            )
        return metadata

    # ------------------------------------------------------------ changelog days

    def _changelog(self, item: TableApplied) -> None:
        key = item.table
        if item.sealed is not None:
            self._report_day(item.sealed)
            if key in self.days and self.days[key].day == item.sealed.day:
                del self.days[key]
        if item.batch is None or item.changelog is None:
            return
        day = changelog_partition(item.batch)
        filling = self.days.get(key)
        if filling is None or filling.day != day:
            filling = ChangelogDay(key, day)
        self.days[key] = filling = filling.plus(item.changelog)
        now = self.clock()
        if filling.batches == 1 or now - self.last_day.get(key, -float("inf")) >= self.every_s:
            self._report_day(filling)
            self.last_day[key] = now

    def _report_day(self, day: ChangelogDay) -> None:
        config = self.tables[day.table].config
        partitions = changelog_days_partitions(config)
        assert partitions.name is not None
        partition = day_partition_key(config, day.day)
        if (partitions.name, partition) not in self.partitions:
            if not self.instance.has_dynamic_partition(partitions.name, partition):
                self.instance.add_dynamic_partitions(partitions.name, [partition])
            self.partitions.add((partitions.name, partition))
        self.emit(
            dg.AssetMaterialization(
                asset_key=changelog_asset_key(config), partition=partition, metadata=changelog_day_metadata(day)
            )
        )
        if day.sealed:  # the day's check, on the partition: a sealed day with a hole or a record twice fails in the UI
            passed, warn, description = day_check_outcome(day)
            self.emit_check(
                dg.AssetCheckEvaluation(
                    asset_key=changelog_asset_key(config), check_name=DAY_CHECK, passed=passed,
                    metadata=day_check_metadata(day), description=description, partition=partition,
                    severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR,
                )
            )  # fmt: skip

    # ------------------------------------------------------------ a whole run at once

    def report_run(self, applied: Sequence[TableApplied]) -> None:
        """What a scheduled apply run did, once per asset: each table's current as the run
        left it (changes summed over its batches) and every changelog day it wrote to."""
        last: dict[str, TableApplied] = {}
        changes: dict[str, int] = {}
        rebuilt: set[str] = set()
        days: dict[tuple[str, str], ChangelogDay] = {}
        vacuumed: dict[str, Vacuumed] = {}
        for item in applied:
            _add_vacuum(vacuumed, item)
            if item.sealed is not None:
                self._report_day(item.sealed)
            if item.batch is not None and item.changelog is not None:
                slot = (item.table, changelog_partition(item.batch))
                days[slot] = days.get(slot, ChangelogDay(*slot)).plus(item.changelog)
            if item.current is not None:
                last[item.table] = item
                changes[item.table] = changes.get(item.table, 0) + item.current.changes_applied
                if item.current.rebuilt:
                    rebuilt.add(item.table)
        for day in days.values():
            self._report_day(day)
        for key, item in last.items():
            assert item.current is not None
            result = replace(item.current, rebuilt=key in rebuilt)
            self._report_current(key, result, changes[key], item.offsets_behind, vacuumed=vacuumed.get(key))
        positions = self.positions()  # tables the run found current and left so: where they stand
        for key in [k for k in self.tables if k not in last and k in positions]:
            self._report_position(key, *positions[key])
