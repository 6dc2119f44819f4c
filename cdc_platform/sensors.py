"""Sensors: closed changelog windows, rehydration, run failures (the Dagster edge).

* ``changelog_windows`` requests each *closed* window of every table (every Kafka
  partition has a record at or after the window end, or the end plus the table's grace
  has passed), in order, at most ``MAX_WINDOWS_PER_TICK`` per table per tick so catching
  up after downtime comes in bounded batches. Its cursor is the last window requested
  per table; it starts at the window holding the first generation's watermark.
* ``rehydration`` starts a new snapshot generation (adds the dynamic partition and
  requests the run, reason in the run's tags) for the reasons in
  ``cdc_platform.rehydration.Reason``; its cursor remembers the cause it acted on per
  table, and a generation still in flight blocks another, so one cause never starts two.
* ``cdc_run_failures`` reports, for each failed run, which table and why.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import dagster as dg
import psycopg

from cdc_platform.config import PlatformConfig, PostgresSource, TableConfig
from cdc_platform.factories.table import (
    COMPLETENESS_CHECK,
    KEYS_CHECK,
    SCHEMA_CHECK,
    changelog_asset_key,
    changelog_partitions,
    current_asset_key,
    generations_partitions,
    new_generation_key,
    snapshot_asset_key,
)
from cdc_platform.rehydration import (
    Need,
    Reason,
    changelog_gap,
    next_needed_offsets,
    reconciliation_due,
    signal_tables,
    slot_lost,
)
from cdc_platform.spark.current import current_path

MAX_WINDOWS_PER_TICK = 24
SIGNALS_REMEMBERED = 1000


# ---------------------------------------------------------------- facts from the instance


@dataclass
class GenerationFacts:
    latest_partition: str | None  # the newest dynamic partition (requested or done)
    materialized: str | None  # the newest generation actually written
    storage_id: int | None
    materialized_at: float | None
    watermark_offsets: dict[int, int]
    watermark_taken_at: datetime | None


def generation_facts(instance: dg.DagsterInstance, table: TableConfig) -> GenerationFacts:
    name = generations_partitions(table).name
    assert name is not None
    partitions = sorted(instance.get_dynamic_partitions(name))
    records = instance.fetch_materializations(snapshot_asset_key(table), limit=1).records
    if not records:
        return GenerationFacts(partitions[-1] if partitions else None, None, None, None, {}, None)
    record = records[0]
    materialization = record.asset_materialization
    assert materialization is not None
    metadata = materialization.metadata
    offsets = metadata.get("watermark_kafka_end_offsets")
    taken = metadata.get("watermark_taken_at")
    return GenerationFacts(
        partitions[-1] if partitions else None,
        materialization.partition,
        record.storage_id,
        record.timestamp,
        {int(p): int(o) for p, o in cast(dict[str, int], offsets.value if offsets else {}).items()},
        datetime.fromisoformat(str(taken.value)) if taken else _generation_time(materialization.partition),
    )


def _generation_time(generation: str | None) -> datetime | None:
    """Generations named by ``new_generation_key`` (gYYYYMMDDTHHMMSSZ) were requested just
    before their watermark: a safe start for changelog windows when the watermark time is
    not in the metadata (generations from before it was recorded)."""
    try:
        return datetime.strptime(generation or "", "g%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def recorded_window_ranges(
    instance: dg.DagsterInstance, table: TableConfig, since: datetime | None
) -> list[tuple[int, int, int]]:
    """Offset ranges of changelog windows materialized since ``since`` (from run metadata)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=changelog_asset_key(table), after_timestamp=since.timestamp() if since else None
        ),
        limit=10_000,
    ).records
    out = []
    for record in records:
        materialization = record.asset_materialization
        value = materialization.metadata.get("offset_ranges") if materialization else None
        ranges: dict[str, list[int]] = cast(dict[str, list[int]], value.value) if value else {}
        for partition, (start, end) in ranges.items():
            out.append((int(partition), int(start), int(end)))
    return out


def failed_check(
    instance: dg.DagsterInstance, table: TableConfig, check_name: str, after_timestamp: float | None
) -> tuple[str, str] | None:
    """(run id, description) of the check's latest evaluation if it failed after the generation."""
    check_key = dg.AssetCheckKey(current_asset_key(table), check_name)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key]).get(check_key)
    if latest is None or latest.status.value != "FAILED" or latest.event is None:
        return None
    if after_timestamp is not None and latest.create_timestamp < after_timestamp:
        return None  # evaluated before the latest generation: that generation was the remedy
    evaluation = latest.event.dagster_event.event_specific_data if latest.event.dagster_event else None
    if getattr(evaluation, "severity", None) == dg.AssetCheckSeverity.WARN:
        return None  # a warning (rows a polled source hard-deleted): reconciliation's job, not a rehydration
    description = getattr(evaluation, "description", None) or f"check {check_name} failed"
    return latest.run_id, str(description)


# ---------------------------------------------------------------- facts from the services


def kafka_earliest_offsets(config: PlatformConfig, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config.kafka.client_config(), "group.id": "cdc_platform_sensor"})
    try:
        found = consumer.list_topics(topic, timeout=15).topics.get(topic)
        if found is None or found.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[0] for p in found.partitions}
    finally:
        consumer.close()


def partitions_past(config: PlatformConfig, topic: str, when: datetime) -> bool:
    """Every Kafka partition of the topic has a record at or after ``when``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config.kafka.client_config(), "group.id": "cdc_platform_sensor"})
    try:
        found = consumer.list_topics(topic, timeout=15).topics.get(topic)
        if found is None or found.error is not None:
            return False
        millis = int(when.timestamp() * 1000)
        offsets = consumer.offsets_for_times([TopicPartition(topic, p, millis) for p in found.partitions], timeout=15)
        return all(tp.offset >= 0 for tp in offsets)
    finally:
        consumer.close()


def source_position_lost(config: PlatformConfig, source: str) -> str | None:
    from cdc_platform.capture.postgres import slot_status

    status = slot_status(config, source)
    remembered = status.get("remembered_slot")
    return slot_lost(status["slot"], bool(status["exists"]), status.get("wal_status"), remembered)


def read_signals(config: PlatformConfig, source: str) -> list[tuple[str, str, str | None]]:
    src = config.sources[source]
    if not isinstance(src, PostgresSource) or not src.signal_table:
        return []
    schema_name, table_name = src.signal_table.split(".", 1)
    with psycopg.connect(src.conninfo(source, "cdc_platform_sensor"), autocommit=True) as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT id::text, type, data FROM {}.{}").format(
                psycopg.sql.Identifier(schema_name), psycopg.sql.Identifier(table_name)
            )
        ).fetchall()
    return [(str(r[0]), str(r[1]), None if r[2] is None else str(r[2])) for r in rows]


def lake_path_exists(path: str) -> bool:
    """Whether the Delta table at ``path`` exists (local paths and pyarrow-supported URIs)."""
    if "://" not in path or path.startswith("file:"):
        return os.path.isdir(os.path.join(path.removeprefix("file:"), "_delta_log"))
    from pyarrow import fs

    filesystem, inner = fs.FileSystem.from_uri(path)
    return bool(filesystem.get_file_info(f"{inner}/_delta_log").type != fs.FileType.NotFound)


# ---------------------------------------------------------------- the sensors


def find_needs(
    context: dg.SensorEvaluationContext,
    config: PlatformConfig,
    table: TableConfig,
    lost: dict[str, str | None],
    signalled: set[str],
) -> tuple[list[Need], GenerationFacts]:
    instance = context.instance
    facts = generation_facts(instance, table)
    needs: list[Need] = []
    if facts.latest_partition is None:
        return [Need(table.key, Reason.BOOTSTRAP, "no snapshot generation yet", "bootstrap")], facts
    generation = facts.materialized or facts.latest_partition
    if table.key in signalled:
        needs.append(Need(table.key, Reason.MANUAL, "asked for in the signal table", f"signal:{generation}"))
    if lost.get(table.source):
        needs.append(Need(table.key, Reason.SOURCE_POSITION_LOST, str(lost[table.source]), f"slot_lost:{generation}"))
    if facts.materialized is None:
        return needs, facts
    if table.poll is not None:
        due = reconciliation_due(
            table.key, generation, facts.materialized_at, table.poll.reconcile_every_s(), time.time()
        )
        if due is not None:
            needs.append(due)
    windows = recorded_window_ranges(instance, table, facts.watermark_taken_at)
    needed = next_needed_offsets(facts.watermark_offsets, windows)
    gap = changelog_gap(table.key, generation, needed, kafka_earliest_offsets(config, config.topic_for(table)))
    if gap is not None:
        needs.append(gap)
    current_records = instance.fetch_materializations(current_asset_key(table), limit=1).records
    built_after = bool(current_records) and (facts.storage_id or 0) < current_records[0].storage_id
    if built_after and not lake_path_exists(current_path(config, table)):
        needs.append(
            Need(table.key, Reason.CURRENT_MISSING, f"{current_path(config, table)} is gone", f"current:{generation}")
        )
    schema = failed_check(instance, table, SCHEMA_CHECK, facts.materialized_at)
    if schema is not None:
        needs.append(Need(table.key, Reason.SCHEMA_INCOMPATIBLE, schema[1], f"schema:{schema[0]}"))
    for check in (KEYS_CHECK, COMPLETENESS_CHECK):
        failed = failed_check(instance, table, check, facts.materialized_at)
        if failed is not None:
            needs.append(Need(table.key, Reason.CHECKS_FAILED, f"{check}: {failed[1]}", f"{check}:{failed[0]}"))
    return needs, facts


def generation_job_name(table: TableConfig) -> str:
    return f"{table.source}__{table.dagster_name}__generation_job"


def changelog_job_name(table: TableConfig) -> str:
    return f"{table.source}__{table.dagster_name}__changelog_job"


def build_rehydration_sensor(config: PlatformConfig) -> dg.SensorDefinition:
    # one job per table: a sensor's target may not mix partitions definitions
    jobs = [
        dg.define_asset_job(
            generation_job_name(t),
            selection=[snapshot_asset_key(t)],
            partitions_def=generations_partitions(t),
            description=f"A snapshot generation of {t.key}.",
        )
        for t in config.tables
    ]

    @dg.sensor(
        name="rehydration",
        jobs=jobs,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Starts a new snapshot generation when a table needs one: bootstrap, changelog gap (Kafka lost "
            "offsets still needed), replication slot lost, incompatible schema, current missing or failing its "
            "checks, a polled table's periodic reconciliation, or a signal row. The reason is in the run's tags; "
            "one cause never starts two generations."
        ),
    )
    def rehydration(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cursor: dict[str, Any] = json.loads(context.cursor) if context.cursor else {}
        acted: dict[str, str] = cursor.setdefault("acted", {})
        seen_signals: list[str] = cursor.setdefault("signals", [])
        # polled (jdbc) sources have no replication slot to lose
        logged = {t.source for t in config.tables if not config.is_polled(t)}
        lost = {source: source_position_lost(config, source) for source in logged}
        signalled: set[str] = set()
        for source in {t.source for t in config.tables}:
            local = {f"{t.schema_name}.{t.table_name}": t.key for t in config.tables if t.source == source}
            for signal_id, kind, data in read_signals(config, source):
                if f"{source}:{signal_id}" in seen_signals:
                    continue
                seen_signals.append(f"{source}:{signal_id}")
                signalled.update(signal_tables(kind, data, source, local))
        del seen_signals[:-SIGNALS_REMEMBERED]
        runs, additions, waiting = [], [], []
        for table in config.tables:
            needs, facts = find_needs(context, config, table, lost, signalled)
            if facts.latest_partition is not None and facts.latest_partition != facts.materialized:
                waiting.append(f"{table.key}: generation {facts.latest_partition} in flight")
                continue  # a generation is already on its way: never two at once
            fresh = [n for n in needs if acted.get(table.key) != n.cause]
            if not fresh:
                continue
            need = fresh[0]
            generation = new_generation_key()
            partitions = generations_partitions(table)
            additions.append(partitions.build_add_request([generation]))
            runs.append(
                dg.RunRequest(
                    run_key=f"{table.key}:{need.cause}",
                    job_name=generation_job_name(table),
                    partition_key=generation,
                    tags={**need.tags(), "cdc/detail": need.detail[:500]},
                )
            )
            acted[table.key] = need.cause
            context.log.info(f"{table.key}: new generation {generation}, reason {need.reason.value}: {need.detail}")
        if not runs:
            return dg.SensorResult(
                skip_reason=dg.SkipReason("; ".join(waiting) or "every table is healthy"), cursor=json.dumps(cursor)
            )
        return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=additions, cursor=json.dumps(cursor))

    return rehydration


def closed_windows(
    config: PlatformConfig, table: TableConfig, after: str | None, first_time: datetime | None, now: datetime
) -> Iterator[str]:
    """Keys of closed windows after the window ``after`` (or from the one holding
    ``first_time``), in order, stopping at the first open one. Walks forward from there
    (never lists every partition since ``changelog.start``: minute windows make many)."""
    partitions = changelog_partitions(table)
    if after is not None:
        key = partitions.get_next_partition_key(after)
    elif first_time is not None:
        key = partitions.get_partition_key_for_timestamp(first_time.timestamp())
    else:
        return
    grace = timedelta(seconds=table.changelog.grace_s)
    while key is not None:
        window = partitions.time_window_for_partition_key(key)
        if window.end > now:
            return  # not over yet
        if now < window.end + grace and not partitions_past(config, config.topic_for(table), window.end):
            return
        yield key
        key = partitions.get_next_partition_key(key)


def build_changelog_sensor(config: PlatformConfig) -> dg.SensorDefinition:
    jobs = [
        dg.define_asset_job(
            changelog_job_name(t),
            selection=[changelog_asset_key(t)],
            partitions_def=changelog_partitions(t),
            description=f"A changelog window of {t.key}.",
        )
        for t in config.tables
    ]

    @dg.sensor(
        name="changelog_windows",
        jobs=jobs,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Requests each closed changelog window of every table, in order, never an open one; after "
            f"downtime it catches up at most {MAX_WINDOWS_PER_TICK} windows per table per tick."
        ),
    )
    def changelog_windows(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        now = datetime.now(UTC)
        runs = []
        for table in config.tables:
            facts = generation_facts(context.instance, table)
            if facts.materialized is None:
                continue  # nothing to apply windows to yet
            requested = []
            for key in closed_windows(config, table, cursor.get(table.key), facts.watermark_taken_at, now):
                requested.append(key)
                if len(requested) >= MAX_WINDOWS_PER_TICK:
                    break
            for key in requested:
                runs.append(
                    dg.RunRequest(
                        run_key=f"{table.key}:{key}",
                        job_name=changelog_job_name(table),
                        partition_key=key,
                        tags={"cdc/table": table.key},
                    )
                )
            if requested:
                cursor[table.key] = requested[-1]
        return dg.SensorResult(run_requests=runs, cursor=json.dumps(cursor))

    return changelog_windows


def failure_report(tags: dict[str, str], message: str) -> str:
    table = tags.get("cdc/table", "unknown table")
    reason = tags.get("cdc/reason")
    where = f"{table} (rehydration: {reason})" if reason else table
    return f"run for {where} failed: {message}"


def describe_failure(context: dg.RunFailureSensorContext) -> str:
    steps = context.get_step_failure_events()
    messages = []
    for event in steps:
        data = event.step_failure_data
        if data.user_failure_data is not None and data.user_failure_data.description:
            messages.append(data.user_failure_data.description)  # our dg.Failure: the message with the fix
        else:
            messages.append(str(data.error.message).strip() if data.error else "unknown error")
    message = "; ".join(messages) or (context.failure_event.message or "run failed")
    return failure_report(dict(context.dagster_run.tags), message)


@dg.run_failure_sensor(name="cdc_run_failures", default_status=dg.DefaultSensorStatus.RUNNING)
def cdc_run_failures(context: dg.RunFailureSensorContext) -> None:
    """Names the table and the reason of every failed run in the sensor's log."""
    context.log.error(describe_failure(context))
