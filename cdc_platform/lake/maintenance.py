"""Files the lake's tables no longer use, deleted on a cadence (VACUUM).

Every stream batch replaces files: the driver's merge rewrites the files of current it
touches (copy on write), Spark's MERGE replaces deletion vectors, auto compaction and a
sealed day's compaction replace small files, a rebuild replaces all of current. Delta keeps
a replaced file for readers of older versions until a VACUUM deletes it; without one, a
lake's disk use grows with every batch and never shrinks (the demo's ``shop.orders``
current: 0.02 MB of live files beside 0.61 MB on disk three minutes after its start; a
1M-row current rewritten by a batch a second would leave about 1 TB a day).

The stream apply deletes, for each table it applies, the files of current, the deletes
table, history and the changelog that a commit replaced more than
``lake.retain_old_files_hours`` ago. Each table's ``delta.deletedFileRetentionDuration``
says the same (``LakeTable.retention``), so Spark's and delta-rs' own VACUUM agree.

Why delta-rs and its "lite" mode: Spark's VACUUM lists and joins every file in Spark jobs,
32-55 s a call for a 100k-row table on a 2-core local driver (docs/benchmarks.md, "Old
files"); delta-rs lists the table's directory in the driver in milliseconds. Lite mode
deletes only files the log records as removed. Its "full" mode (every file the log does
not name) deleted the *live* deletion-vector files of a Spark-merged table in delta-rs
1.6.6, leaving it unreadable, so it is never used. What lite mode leaves, the deletion
vectors Spark's MERGE replaced (one file per batch that merged through Spark),
``lake/deletion_vectors.py`` deletes from what the table's log says is still in use.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cdc_platform.lake.deletion_vectors import delete_replaced_vectors
from cdc_platform.lake.tables import LakeTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vacuumed:
    """What one VACUUM of a table's Delta tables did."""

    table: str
    files_deleted: int
    seconds: float
    failures: tuple[str, ...] = ()  # "<path>: <reason>" of each table whose VACUUM failed

    def then(self, later: Vacuumed) -> Vacuumed:
        """This VACUUM and a later one of the same table, as one report: files and seconds
        summed, the later one's failures (a failure the later VACUUM did not repeat is over)."""
        files, seconds = self.files_deleted + later.files_deleted, self.seconds + later.seconds
        return Vacuumed(self.table, files, seconds, later.failures)


def vacuumed_paths(table: LakeTable) -> list[str]:
    """The tables every batch writes to: current, its deletes, the changelog, history.
    (A generation's snapshot is written once; the dead letters only grow.)"""
    paths = [table.current_path, table.deletes_path, table.changelog_path]
    return [*paths, table.history_path] if table.config.history else paths


def vacuum_table(table: LakeTable) -> Vacuumed:
    """Delete the files of ``table``'s Delta tables that a commit replaced more than
    ``retain_old_files_hours`` ago. A table that fails is reported in ``failures`` and the
    others are still vacuumed: old files are only disk space, and the next VACUUM tries again."""
    from deltalake import DeltaTable

    started = time.monotonic()
    deleted, failures = 0, []
    for path in vacuumed_paths(table):
        try:
            if not DeltaTable.is_deltatable(path):
                continue  # not written yet
            # the retention passed, not read from the table: a table of an older lake gets the
            # property only when the apply next ensures its properties
            hours = table.retain_old_files_hours
            files = DeltaTable(path).vacuum(hours, dry_run=False, enforce_retention_duration=False, full=False)
            files += delete_replaced_vectors(path, hours)  # lite mode leaves them (lake/deletion_vectors.py)
        except Exception as exc:  # any reason (a feature delta-rs refuses, storage): reported, tried next time
            failures.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        deleted += len(files)
    return Vacuumed(table.key, deleted, round(time.monotonic() - started, 3), tuple(failures))


class VacuumCadence:
    """When each table is vacuumed next: on its first pass in a process, then every
    ``LakeTable.vacuum_every_s`` (never when None). Called from the thread that applies
    the table, so a VACUUM never runs beside that table's own commits."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def due(self, table: LakeTable, now: float) -> bool:
        every = table.vacuum_every_s
        last = self._last.get(table.key)
        return every is not None and (last is None or now - last >= every)

    def maintain(self, table: LakeTable) -> Vacuumed | None:
        """Vacuum ``table`` if it is due; log what it did (a failure as a warning: it is retried)."""
        now = time.monotonic()
        if not self.due(table, now):
            return None
        self._last[table.key] = now
        done = vacuum_table(table)
        if done.failures:
            log.warning(
                "%s: VACUUM of old files failed (retried in %s s; the tables are unaffected, only disk use grows): %s",
                table.key, table.vacuum_every_s, "; ".join(done.failures),
            )  # fmt: skip
        if done.files_deleted:
            log.info(
                "%s: VACUUM deleted %d file(s) replaced over %d h ago, in %.3f s",
                table.key, done.files_deleted, table.retain_old_files_hours, done.seconds,
            )  # fmt: skip
        return done
