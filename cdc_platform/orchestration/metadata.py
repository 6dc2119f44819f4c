"""The one place where the core's typed results become Dagster metadata (numeric values
where the UI can plot them). Metadata is for display: the state is in the ledger."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from cdc_platform.lake.changelog import ChangelogDay, WindowResult
from cdc_platform.lake.checks import CompletenessReport, KeysReport
from cdc_platform.lake.compare import ExactComparison, RowComparison, VersionChain
from cdc_platform.lake.current import CurrentResult
from cdc_platform.lake.maintenance import Vacuumed
from cdc_platform.lake.schema_registry import SchemaReport
from cdc_platform.lake.snapshot import SnapshotResult
from cdc_platform.model.chunks import WaveProgress
from cdc_platform.sources.base import CaptureSilence, MetricValue, Observation

Metadata = dict[str, Any]


def metric(value: MetricValue) -> Any:
    if isinstance(value, bool):
        return dg.MetadataValue.bool(value)
    if isinstance(value, int):
        return dg.MetadataValue.int(value)
    if isinstance(value, float):
        return dg.MetadataValue.float(value)
    return dg.MetadataValue.text("" if value is None else str(value))


def observation_metadata(observed: Observation) -> Metadata:
    described, key = observed.described, observed.schema.key
    column_schema = dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=c.name,
                type=c.type_name,
                description="key column" if c.name in key else None,
                constraints=dg.TableColumnConstraints(nullable=c.nullable, unique=(key == (c.name,))),
            )
            for c in described.columns
        ]
    )
    return {
        "dagster/row_count": dg.MetadataValue.int(observed.rows),
        "rows": dg.MetadataValue.int(observed.rows),
        "rows_exact": dg.MetadataValue.bool(observed.rows_exact),
        "columns": dg.MetadataValue.int(len(described.columns)),
        "schema_hash": dg.MetadataValue.text(described.schema_hash()),
        "key_columns": dg.MetadataValue.text(", ".join(key)),
        "replica_identity": dg.MetadataValue.text(described.replica_identity),
        "dagster/column_schema": column_schema,
        **{name: metric(value) for name, value in observed.capture.items()},
    }


def snapshot_metadata(result: SnapshotResult, reason: str, detail: str | None) -> Metadata:
    metadata: Metadata = {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rows": dg.MetadataValue.int(result.rows),
        "source_rows": dg.MetadataValue.int(result.source_rows),
        "bytes": dg.MetadataValue.int(result.bytes),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "spark_partitions": dg.MetadataValue.int(result.spark_partitions),
        "snapshot_chunks": dg.MetadataValue.int(result.spark_partitions),  # one Spark task per chunk
        "snapshot_mode": dg.MetadataValue.text("exported" if result.consistent else "incremental"),
        "rows_per_s": dg.MetadataValue.float(round(result.rows / result.duration_s, 1) if result.duration_s else 0.0),
        "watermark_lsn": dg.MetadataValue.text(result.position),
        "watermark_lsn_int": dg.MetadataValue.int(result.watermark.position),
        "watermark_taken_at": dg.MetadataValue.text(result.watermark.taken_at.isoformat()),
        "watermark_kafka_end_offsets": dg.MetadataValue.json(
            {str(p): o for p, o in result.watermark.kafka_end_offsets.items()}
        ),
        "schema_hash": dg.MetadataValue.text(result.schema_hash),
        "key_columns": dg.MetadataValue.text(", ".join(result.key_columns)),
        "path": dg.MetadataValue.path(result.path),
        "dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(name=name, type=lake_type) for name, lake_type in result.columns]
        ),
        "rehydration_reason": dg.MetadataValue.text(reason),
    }
    if detail:
        metadata["rehydration_detail"] = dg.MetadataValue.text(detail)
    if result.source_note:
        metadata["source_prepared"] = dg.MetadataValue.text(result.source_note)
    return metadata


def wave_metadata(progress: WaveProgress) -> Metadata:
    """A chunked generation's standing after a wave: numbers, so the UI can plot them."""
    metadata: Metadata = {
        "snapshot_chunks_done": dg.MetadataValue.int(progress.chunks_done),
        "snapshot_chunks": dg.MetadataValue.int(progress.chunks),
        "snapshot_percent": dg.MetadataValue.float(round(100 * progress.share, 1)),
        "rows_done": dg.MetadataValue.int(progress.rows_done),
        "source_rows": dg.MetadataValue.int(progress.source_rows),
        "rows_per_s": dg.MetadataValue.float(round(progress.rows_per_s, 1)),
    }
    if progress.eta_s is not None:
        metadata["eta_s"] = dg.MetadataValue.float(round(progress.eta_s, 1))
    return metadata


def changelog_metadata(result: WindowResult, position: Callable[[int], str]) -> Metadata:
    metadata: Metadata = {
        "events": dg.MetadataValue.int(result.rows),
        "dead_letters": dg.MetadataValue.int(result.dead_letters),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "reused_ranges": dg.MetadataValue.bool(result.reused_ranges),
        "offset_ranges": dg.MetadataValue.json({str(r.partition): [r.start, r.end] for r in result.ranges}),
        "offsets": dg.MetadataValue.int(sum(r.end - r.start for r in result.ranges)),
        "schema_registered": dg.MetadataValue.bool(result.schema_registered),
    }
    for op in ("c", "u", "d", "t", "r", "tombstone"):
        metadata[f"events_{op}"] = dg.MetadataValue.int(result.events.get(op, 0))
    if result.min_commit_lsn is not None and result.max_commit_lsn is not None:
        metadata["min_commit_lsn"] = dg.MetadataValue.text(position(result.min_commit_lsn))
        metadata["max_commit_lsn"] = dg.MetadataValue.text(position(result.max_commit_lsn))
    return metadata


def current_metadata(
    result: CurrentResult, position: Callable[[int], str], offsets_behind: int | None = None,
    capture: CaptureSilence | None = None,
) -> Metadata:  # fmt: skip
    """``offsets_behind``: for a streamed table, the Kafka offsets not yet applied when the pass
    read the topics (0: caught up, so it is not behind however old its last change is, while
    ``capture``, how long the source's capture has been silent, shows it running)."""
    metadata: Metadata = {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rows": dg.MetadataValue.int(result.rows),
        "changes_applied": dg.MetadataValue.int(result.changes_applied),
        "rebuilt": dg.MetadataValue.bool(result.rebuilt),
        "generation": dg.MetadataValue.text(result.generation),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "frontier": dg.MetadataValue.json({str(p): o for p, o in result.frontier.items()}),
        "last_applied_lsn": dg.MetadataValue.text(position(result.applied_position)),
    }
    if result.dropped_by_generation is not None:
        metadata["rows_dropped_by_generation"] = dg.MetadataValue.int(result.dropped_by_generation)
        metadata["dropped_sample"] = dg.MetadataValue.json(result.dropped_sample)
    if offsets_behind is not None:
        metadata["offsets_behind"] = dg.MetadataValue.int(offsets_behind)
    if result.last_source_ts is not None:
        metadata["last_source_commit"] = dg.MetadataValue.timestamp(result.last_source_ts)
    lag = freshness_lag_s(result, offsets_behind, capture)
    if lag is not None:
        metadata["freshness_lag_s"] = dg.MetadataValue.float(lag)
    if capture is not None:
        metadata["capture_silent_s"] = dg.MetadataValue.float(round(capture.seconds, 1))
    return metadata


def vacuum_metadata(vacuumed: Vacuumed) -> Metadata:
    """The VACUUMs of old files since the last report (``lake.vacuum_every_minutes``)."""
    metadata: Metadata = {
        "old_files_deleted": dg.MetadataValue.int(vacuumed.files_deleted),
        "vacuum_s": dg.MetadataValue.float(round(vacuumed.seconds, 3)),
    }
    if vacuumed.failures:  # the tables are unaffected; only disk use grows until a VACUUM succeeds
        metadata["vacuum_failed"] = dg.MetadataValue.text("; ".join(vacuumed.failures))
    return metadata


def is_fresh(
    result: CurrentResult, offsets_behind: int | None, within_s: float, waited_s: float | None = None,
    capture: CaptureSilence | None = None,
) -> bool:  # fmt: skip
    """Current within ``within_s`` (``tables[].checks.fresh_within_s``) of the source, caught
    up (with capture running), or its lag unknown; and no change applied since the last
    report waited longer than that from its commit to current (``waited_s``, the longest).
    Current lags the source most just before a batch commits, by that batch's oldest
    change's wait: a lag read at a batch's end (its newest change's wait) alone passed a
    table whose changes each waited minutes for their batch."""
    lag = freshness_lag_s(result, offsets_behind, capture)
    return (lag is None or lag <= within_s) and (waited_s is None or waited_s <= within_s)


def fresh_check_metadata(
    result: CurrentResult, offsets_behind: int | None, within_s: float, eta_s: float | None = None,
    waited_s: float | None = None, capture: CaptureSilence | None = None,
) -> Metadata:  # fmt: skip
    lag = freshness_lag_s(result, offsets_behind, capture)
    metadata: Metadata = {"fresh_within_s": dg.MetadataValue.float(within_s)}
    if capture is not None:
        metadata["capture_silent_s"] = dg.MetadataValue.float(round(capture.seconds, 1))
    if lag is not None:
        metadata["freshness_lag_s"] = dg.MetadataValue.float(round(lag, 1))
    if waited_s is not None:
        metadata["longest_wait_s"] = dg.MetadataValue.float(round(waited_s, 1))
    if offsets_behind is not None:
        metadata["offsets_behind"] = dg.MetadataValue.int(offsets_behind)
    return {**metadata, **catch_up_metadata(offsets_behind, eta_s)}


def catch_up_metadata(offsets_behind: int | None, eta_s: float | None) -> Metadata:
    """``catch_up_eta_s`` while there is a backlog: when the table is expected to catch up."""
    return {"catch_up_eta_s": dg.MetadataValue.float(eta_s)} if offsets_behind and eta_s is not None else {}


def fresh_check_description(
    result: CurrentResult, offsets_behind: int | None, within_s: float, source: str, waited_s: float | None = None,
    capture: CaptureSilence | None = None,
) -> str | None:  # fmt: skip
    lag = freshness_lag_s(result, offsets_behind, capture)
    if lag is not None and lag > within_s and capture is not None and capture.stalled and capture.seconds >= lag:
        return (
            f"capture of source '{source}' has shown no sign of reading the source for {capture.seconds:.0f} s (a "
            f"running one is never silent longer than {capture.stalled_after_s:g} s): changes committed since are "
            "not in Kafka, so "
            f"current may be that far behind the source, more than {within_s:.0f} s "
            f"(tables[].checks.fresh_within_s), though it holds everything Kafka has; {capture.advice}"
        )
    if lag is not None and lag > within_s:
        return (
            f"current is {lag:.0f} s behind the source{_offsets_not_applied(offsets_behind)}, more than "
            f"{within_s:.0f} s (tables[].checks.fresh_within_s): the stream apply is behind (a backlog; its log "
            f"and catch_up_eta_s say when it is done) or not running: start `cdc-platform apply --source {source}`, "
            f"or set sources.{source}.apply.schedule for a Dagster run on a cron"
        )
    if waited_s is not None and waited_s > within_s:
        return (
            f"a change reached current {waited_s:.0f} s after its commit, more than {within_s:.0f} s "
            "(tables[].checks.fresh_within_s): current lagged the source that long before its batch committed. "
            "The apply's log gives each batch's 'oldest change … after its commit': batches slower than that "
            "(a busy machine, too many tables for the apply's parallelism) or a paused apply catching up; "
            "raise fresh_within_s if such a lag is acceptable for this table"
        )
    return None


def _offsets_not_applied(offsets_behind: int | None) -> str:
    return "" if offsets_behind is None else f" ({offsets_behind} offset(s) not applied)"


def freshness_lag_s(
    result: CurrentResult, offsets_behind: int | None, capture: CaptureSilence | None = None
) -> float | None:
    """How far current is behind the source: 0 when caught up (however old its last change),
    else the age of the newest change it holds; None when neither is known. Either way at
    least as long as capture has been silent, once it is stalled: caught up with Kafka
    is not caught up with the source when nothing puts the source's changes in Kafka (a
    check that passed while capture was down for an hour)."""
    if offsets_behind == 0:
        lag: float | None = 0.0
    elif result.last_source_ts is None:
        lag = None
    else:
        lag = (datetime.now(UTC) - result.last_source_ts).total_seconds()
    if capture is not None and capture.stalled:
        return max(lag or 0.0, capture.seconds)
    return lag


def changelog_day_metadata(day: ChangelogDay) -> Metadata:
    """A streamed changelog's day: while it fills (what this apply process wrote to it) and
    once sealed (the whole day, its ranges checked contiguous and each record in it once)."""
    metadata: Metadata = {
        "day": dg.MetadataValue.text(day.day[:10]),
        "sealed": dg.MetadataValue.bool(day.sealed),
        "batches": dg.MetadataValue.int(day.batches),
        "events": dg.MetadataValue.int(sum(day.events.values())),
        "dead_letters": dg.MetadataValue.int(day.dead_letters),
        "offset_ranges": dg.MetadataValue.json({str(p): [s, e] for p, (s, e) in sorted(day.ranges.items())}),
        "offsets": dg.MetadataValue.int(sum(e - s for s, e in day.ranges.values())),
        "engine": dg.MetadataValue.text("stream"),
    }
    for op in ("c", "u", "d", "t", "r", "tombstone"):
        metadata[f"events_{op}"] = dg.MetadataValue.int(day.events.get(op, 0))
    if day.sealed:
        metadata["contiguous"] = dg.MetadataValue.bool(not day.holes)
        metadata["holes"] = dg.MetadataValue.json(list(day.holes))
        metadata["records_twice"] = dg.MetadataValue.int(day.records_twice)
    else:
        metadata["counted_since"] = dg.MetadataValue.text("this apply process started (sealed days count all)")
    return metadata


def day_check_metadata(day: ChangelogDay) -> Metadata:
    """The ``every_offset_once`` check of a changelog day (numeric, so the UI can plot it)."""
    return {
        "day": dg.MetadataValue.text(day.day[:10]),
        "sealed": dg.MetadataValue.bool(day.sealed),
        "batches": dg.MetadataValue.int(day.batches),
        "offsets": dg.MetadataValue.int(sum(e - s for s, e in day.ranges.values())),
        "events": dg.MetadataValue.int(sum(day.events.values())),
        "holes": dg.MetadataValue.int(len(day.holes)),
        "records_twice": dg.MetadataValue.int(day.records_twice),
        "records_counted": dg.MetadataValue.bool(day.records_counted),
        "records_written": dg.MetadataValue.int(day.records_written or 0),
        "records_held": dg.MetadataValue.int(day.records_held or 0),
        "records_missing": dg.MetadataValue.int(max(day.records_missing, 0)),
        "sample": dg.MetadataValue.json(list(day.holes[:10])),
    }


def day_check_outcome(day: ChangelogDay) -> tuple[bool, bool, str | None]:
    """The day check's (passed, warn, description). A day whose batches did not all say how
    many records they wrote (recorded by an older version) warns that its records were not
    counted: its offsets are still checked contiguous and once."""
    if not day.clean:
        return False, False, day_check_description(day)
    if not day.records_counted:
        return False, True, (
            f"changelog day {day.day[:10]} of {day.table}: offsets contiguous and each record once, but its records "
            "were not counted back: some of its batches were recorded before the ledger kept what each wrote (a "
            "lake written by an older version). Days written from now on are counted"
        )  # fmt: skip
    return True, False, None


def day_check_description(day: ChangelogDay) -> str | None:
    """What a failed day check found, and the fix for each; None when it passed."""
    if day.clean:
        return None
    found = counted_in_words(
        (len(day.holes), "hole(s) between batches"),
        (day.records_twice, "record(s) twice"),
        (max(day.records_missing, 0), "record(s) its batches wrote no longer in it"),
        (max(-day.records_missing, 0), "record(s) in its offsets that no batch wrote"),
    )
    fixes = []
    if day.holes:  # offsets the apply never appended, so never merged either
        fixes.append(f"a hole's changes never reached current: a new generation (cdc-platform rehydrate {day.table})")
    if day.records_twice:  # current and history ignore a repeated position; the changelog's readers do not
        fixes.append(
            f"rewrite the day without its copies (dropDuplicates on kafka_partition, kafka_offset; Delta replaceWhere "
            f"window_start = '{day.day}'); current and history applied each record once"
        )
    if day.records_missing:  # written, then removed or added by something other than the apply
        fixes.append(
            f"something other than the apply changed the day: find its commit in the Delta history of "
            f"{day.table}'s changelog (DESCRIBE HISTORY; the apply's commits carry the batch in userMetadata) and "
            f"RESTORE the table to the version before it; current and history applied every record when it was read"
        )
    return f"changelog day {day.day[:10]} of {day.table}: {found}. Fix: " + "; ".join(fixes)


def history_metadata(result: CurrentResult) -> Metadata:
    assert result.history is not None
    return {
        "versions_opened": dg.MetadataValue.int(result.history.versions_opened),
        "versions_closed": dg.MetadataValue.int(result.history.versions_closed),
        "generation": dg.MetadataValue.text(result.generation),
    }


def history_check_metadata(comparison: ExactComparison) -> Metadata:
    rows = comparison.rows or RowComparison()
    return {
        "compared": dg.MetadataValue.bool(comparison.rows is not None),
        "open_versions": dg.MetadataValue.int(comparison.source_rows),
        "current_rows": dg.MetadataValue.int(comparison.current_rows),
        "keys_compared": dg.MetadataValue.int(rows.compared),
        "open_versions_not_in_current": dg.MetadataValue.int(rows.missing),
        "current_rows_without_open_version": dg.MetadataValue.int(rows.extra),
        "differing_rows": dg.MetadataValue.int(rows.differing),
        "keys_with_two_open_versions": dg.MetadataValue.int(rows.repeated),
        "keys_in_flight": dg.MetadataValue.int(comparison.in_flight_keys),
        "current_version": dg.MetadataValue.int(comparison.current_version),
        "note": dg.MetadataValue.text(comparison.note),
        "sample_keys": dg.MetadataValue.json(rows.sample),
    }


def history_check_outcome(comparison: ExactComparison, table_key: str) -> tuple[bool, bool, str | None]:
    """The history check's (passed, warn, description) from its comparison. One that could
    not compare (``rows`` None: the pin moved, a truncate or too many offsets in flight)
    warns, as completeness does: passing would show a history nothing verified as green."""
    rows = comparison.rows
    if rows is None:
        return False, True, f"history not compared with current this time, so not verified: {comparison.note}"
    if not (rows.missing or rows.extra or rows.differing or rows.repeated):
        return True, False, comparison.note or None
    return (
        False,
        False,
        (
            f"history's open versions do not match current ({history_mismatch(comparison)}; see sample_keys). "
            f"A new generation (cdc-platform rehydrate {table_key}) opens a version for each row that "
            "differs from its open one and closes the open versions of keys the source no longer holds"
        ),
    )


def history_mismatch(comparison: ExactComparison) -> str:
    """The history check's failure in words (history is the comparison's "source" side)."""
    rows = comparison.rows or RowComparison()
    return counted_in_words(
        (rows.missing, "open version(s) of keys current does not hold"),
        (rows.extra, "current row(s) without an open version"),
        (rows.differing, "open version(s) that differ from current"),
        (rows.repeated, "key(s) with two open versions"),
    )


def counted_in_words(*parts: tuple[int, str]) -> str:
    """'3 rows that …, 1 key …': the parts that counted anything."""
    return ", ".join(f"{n} {what}" for n, what in parts if n)


def chain_check_metadata(chain: VersionChain) -> Metadata:
    return {
        "versions_checked": dg.MetadataValue.int(chain.versions),
        "versions_starting_twice": dg.MetadataValue.int(chain.starting_twice),
        "versions_overlapping_the_next": dg.MetadataValue.int(chain.overlapping),
        "versions_without_end": dg.MetadataValue.int(chain.without_end),
        "versions_misdated": dg.MetadataValue.int(chain.misdated),
        "sample_keys": dg.MetadataValue.json(chain.sample),
    }


def chain_faults(chain: VersionChain) -> str:
    """The chain check's failure in words."""
    return counted_in_words(
        (chain.starting_twice, "version(s) starting where another of their key starts (an event applied twice)"),
        (chain.overlapping, "version(s) open or not yet ended when the next version of their key begins"),
        (chain.without_end, "closed version(s) without an end, or open one(s) with one"),
        (chain.misdated, "version(s) ending before they start or not valid until the next one begins"),
    )


def schema_check_metadata(report: SchemaReport) -> Metadata:
    change = report.change
    offending = sorted({*change.added, *change.dropped, *(r.split(":")[0] for r in change.retyped)}) if change else []
    return {
        "schema_version": dg.MetadataValue.int(report.version),
        "registered_new_version": dg.MetadataValue.bool(report.registered),
        "compatibility": dg.MetadataValue.text(report.compatibility),
        "change": dg.MetadataValue.text(change.summary() if change else "none"),
        "incompatibilities": dg.MetadataValue.int(len(change.problems) if change else 0),
        "offending_columns": dg.MetadataValue.json(offending),
        "pandera_errors": dg.MetadataValue.int(len(report.pandera_errors)),
        "pandera_sample": dg.MetadataValue.json(report.pandera_errors[:5]),
        "source_compared": dg.MetadataValue.bool(report.observed is not None),
        "note": dg.MetadataValue.text(report.note or ""),
    }


def keys_check_metadata(keys: KeysReport) -> Metadata:
    return {
        "rows_checked": dg.MetadataValue.int(keys.rows),
        "null_keys": dg.MetadataValue.int(keys.null_keys),
        "duplicate_keys": dg.MetadataValue.int(keys.duplicate_keys),
        "mismatches": dg.MetadataValue.int(keys.null_keys + keys.duplicate_keys),
        "sample_keys": dg.MetadataValue.json(keys.sample),
    }


def changelog_keys_check_metadata(keys: KeysReport) -> Metadata:
    return {
        "kafka_events_checked": dg.MetadataValue.int(keys.kafka_events_checked),
        "kafka_key_mismatches": dg.MetadataValue.int(keys.kafka_key_mismatches),
        "kafka_unstable_rows": dg.MetadataValue.int(keys.kafka_unstable_rows),
        "changelog_records_twice": dg.MetadataValue.int(keys.changelog_records_twice),
        "sample": dg.MetadataValue.json(keys.kafka_sample),
    }


def keys_check_description(keys: KeysReport, table: str) -> str | None:
    """What the keys check found in current, and the fix; None when it passed."""
    if keys.current_passed:
        return None
    found = counted_in_words(
        (keys.null_keys, "row(s) of current with a null key"), (keys.duplicate_keys, "key(s) twice in current")
    )
    return f"{found}. Fix: current is rebuilt by a new generation, which the rehydration sensor starts ({table})."


def changelog_keys_check_description(keys: KeysReport, table: str) -> str | None:
    """What the changelog keys check found in the topic and the changelog, and the fix for
    each finding; None when it passed. Current is not blocked by these: it applied each
    record once by its position."""
    if keys.changelog_passed:
        return None
    found = counted_in_words(
        (keys.kafka_key_mismatches, "recent Kafka record(s) not keyed by exactly the key columns"),
        (keys.kafka_unstable_rows, "row(s) with two Kafka key texts"),
        (keys.changelog_records_twice, "Kafka record(s) twice in the changelog"),
    )
    fixes = []
    if keys.kafka_key_mismatches or keys.kafka_unstable_rows:
        fixes.append(
            "another producer (or a connector with other key settings) writes the topic: stop it; per-key order "
            f"across partitions is lost, so rehydrate once it stopped (cdc-platform rehydrate {table})"
        )
    if keys.changelog_records_twice:
        fixes.append(
            "a changelog append was not idempotent: rewrite the day without the copies (dropDuplicates on "
            "kafka_partition, kafka_offset); current and history applied each record once"
        )
    return f"{found}. Fix: " + "; ".join(fixes) + ". A generation does not change the changelog: none is started."


def completeness_check_metadata(report: CompletenessReport, dropped_by_generation: int | None) -> Metadata:
    return {
        "deleted_in_source": dg.MetadataValue.int(report.deleted_in_source),
        "rows_dropped_by_generation": dg.MetadataValue.int(dropped_by_generation or 0),
        "offsets_missing": dg.MetadataValue.int(report.offsets_missing),
        "holes": dg.MetadataValue.json(report.holes[:10]),
        "dead_letters": dg.MetadataValue.int(report.dead_letters),
        "dead_letters_examined": dg.MetadataValue.int(report.dead_letters_examined),
        "max_dead_letters_per_window": dg.MetadataValue.int(report.max_dead_letters_per_window),
        "dead_letter_threshold": dg.MetadataValue.int(report.dead_letter_threshold),
        "reconciled": dg.MetadataValue.bool(report.compared),
        "reconcile_note": dg.MetadataValue.text(report.compare_note),
        "rows_checked": dg.MetadataValue.int(report.current_rows),
        "source_rows": dg.MetadataValue.int(report.source_rows),
        "rows_compared": dg.MetadataValue.int(report.compared_rows),
        "missing_rows": dg.MetadataValue.int(report.missing),
        "extra_rows": dg.MetadataValue.int(report.extra),
        "differing_rows": dg.MetadataValue.int(report.differing),
        "keys_repeated_in_source": dg.MetadataValue.int(report.repeated),
        "mismatches": dg.MetadataValue.int(report.missing + report.extra + report.differing),
        "keys_in_flight": dg.MetadataValue.int(report.in_flight_keys),
        "offsets_in_flight": dg.MetadataValue.int(report.in_flight_offsets),
        "sample_keys": dg.MetadataValue.json(report.sample),
        **feed_metadata(report),
    }


def feed_metadata(report: CompletenessReport) -> Metadata:
    """Rows the source wrote and events the topic got since the last reading (numbers to
    plot), and why the topic looks unfed."""
    metadata: Metadata = {"topic_unfed": dg.MetadataValue.text(report.unfed or "no")}
    if report.source_changes is not None and report.topic_events is not None:
        metadata["source_rows_written"] = dg.MetadataValue.int(report.source_changes)
        metadata["topic_events"] = dg.MetadataValue.int(report.topic_events)
    return metadata


def table_spec_metadata(values: Mapping[str, str]) -> Metadata:
    return {k: dg.MetadataValue.text(v) for k, v in values.items()}
