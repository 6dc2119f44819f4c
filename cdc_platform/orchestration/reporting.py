"""What a running stream apply tells Dagster: runless materializations of each table's
current (and history), throttled, so the UI shows frontier, applied position and
freshness lag without a run per micro-batch and without an event log that explodes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import dagster as dg

from cdc_platform.lake.apply import TableApplied
from cdc_platform.lake.tables import LakeTable
from cdc_platform.orchestration.keys import current_asset_key, history_asset_key
from cdc_platform.orchestration.metadata import current_metadata, history_metadata

log = logging.getLogger("cdc_platform.apply")

REPORT_EVERY_S = 60.0  # at most one materialization per table and asset per minute


class RunlessReporter:
    """Reports the newest state of each table's current at most every ``every_s``; a
    rebuild from a new generation is reported at once."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        tables: Sequence[LakeTable],
        position: Callable[[int], str],
        every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance, self.position, self.every_s, self.clock = instance, position, every_s, clock
        self.tables = {t.key: t for t in tables}
        self.last: dict[str, float] = {}
        self.changes_since: dict[str, int] = {}

    def __call__(self, applied: Sequence[TableApplied]) -> None:
        for item in applied:
            if item.current is None or item.table not in self.tables:
                continue
            key = item.table
            self.changes_since[key] = self.changes_since.get(key, 0) + item.current.changes_applied
            now = self.clock()
            if not item.current.rebuilt and now - self.last.get(key, -float("inf")) < self.every_s:
                continue
            self._report(item, self.changes_since.pop(key))
            self.last[key] = now

    def _report(self, item: TableApplied, changes: int) -> None:
        assert item.current is not None
        config = self.tables[item.table].config
        metadata = {
            **current_metadata(item.current, self.position),
            # everything applied since the last report (the throttle folds micro-batches)
            "changes_applied": dg.MetadataValue.int(changes),
            "engine": dg.MetadataValue.text("stream"),
        }
        try:
            self.instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=current_asset_key(config), metadata=metadata)
            )
            if item.current.history is not None:
                history = history_metadata(item.current)
                self.instance.report_runless_asset_event(
                    dg.AssetMaterialization(asset_key=history_asset_key(config), metadata=history)
                )
        except Exception as exc:  # the lake is what matters; the UI catches up on the next report
            log.warning("%s: could not report to Dagster (%s); applying goes on", item.table, exc)
