"""One factory per captured table, returning that table's ``dg.Definitions``.

Asset keys are ``[<source>, <table>, …]`` and each table is its own asset group, so the
UI shows one group per source table. Today a table contributes the observed source
table; the snapshot, changelog and current-state assets join this group as they land.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast

import dagster as dg
import psycopg
import pymysql
from dagster_pyspark import PySparkResource
from psycopg import sql

from cdc_platform.capture.errors import classify_postgres_error
from cdc_platform.capture.jdbc import TableCursor, classify_mysql_error, read_stored_cursors
from cdc_platform.capture.mysql_catalog import describe_mysql_table, quote_mysql
from cdc_platform.capture.pg_catalog import (
    SourceTable,
    SourceTableError,
    describe_table,
    resolve_key,
    slot_position,
)
from cdc_platform.capture.postgres import prepare_new_slot
from cdc_platform.config import JdbcSource, MissingSecretError, PlatformConfig, TableConfig
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.resources.jdbc import JdbcSourcesResource
from cdc_platform.resources.postgres import PostgresSourcesResource
from cdc_platform.spark.changelog import (
    ChangelogGapError,
    DeadLetterError,
    WindowNotClosedError,
    WindowResult,
    changelog_path,
    materialize_window,
)
from cdc_platform.spark.checks import (
    SchemaReport,
    check_completeness,
    check_keys,
    check_schema,
    pandera_errors,
    recent_changelog,
)
from cdc_platform.spark.current import (
    POSITION_COLUMNS,
    CurrentResult,
    CurrentStateError,
    apply_changes,
    current_path,
    history_path,
    pending_generation,
)
from cdc_platform.spark.snapshot import SnapshotError, SnapshotResult, table_root, take_snapshot

# Tables estimated above this are not count(*)-ed on every observation.
EXACT_COUNT_LIMIT = 5_000_000


SCHEMA_CHECK = "schema_compatible"
KEYS_CHECK = "keys"
COMPLETENESS_CHECK = "completeness"
# retriable failures (network, broker or database briefly unavailable) retry with backoff;
# fatal ones raise dg.Failure(allow_retries=False) with the fix
RETRY_POLICY = dg.RetryPolicy(max_retries=3, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


# current (and history) follow their inputs: a new generation or a new changelog window
CURRENT_AUTOMATION = (
    dg.AutomationCondition.any_deps_updated().since_last_handled() & ~dg.AutomationCondition.in_progress()
).with_label("after a new generation or changelog window")


def group_name(table: TableConfig) -> str:
    return f"{table.source}_{table.dagster_name}"


def source_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "source"])


def build_table_definitions(config: PlatformConfig, table: TableConfig) -> dg.Definitions:
    source = config.sources[table.source]
    polled = config.is_polled(table)
    kind = source.dialect if isinstance(source, JdbcSource) else "postgres"
    how = (
        f"Polled ({table.poll.mode if table.poll else ''}); hard deletes are not seen by polling"
        if polled
        else "Captured by logical decoding"
    )
    spec = dg.AssetSpec(
        key=source_asset_key(table),
        group_name=group_name(table),
        kinds={kind},
        description=(
            f"Source table {table.schema_name}.{table.table_name} in {kind} database "
            f"'{source.database}' ({source.host}:{source.port}). {how}. Observed: columns, key "
            "and row count; the data version changes with the schema and row count."
        ),
        metadata={
            "source": table.source,
            "table": f"{table.schema_name}.{table.table_name}",
            "topic": config.topic_for(table),
            "changelog_window": table.changelog.window,
            "compatibility": table.compatibility.value,
            "errors_tolerance": table.errors.tolerance.value,
        },
        tags={"cdc/source": table.source},
    )

    observe_source_table = (
        build_polled_observation(config, table, spec)
        if config.is_polled(table)
        else build_pg_observation(config, table, spec)
    )
    snapshot = build_snapshot_asset(config, table)
    changelog = build_changelog_asset(config, table)
    current = build_current_asset(config, table)
    return dg.Definitions(assets=[observe_source_table, snapshot, changelog, current])


def build_pg_observation(config: PlatformConfig, table: TableConfig, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    @dg.multi_observable_source_asset(
        specs=[spec],
        name=f"observe_{table.source}_{table.dagster_name}",
        description=f"Observe {table.key} in its source database.",
    )
    def observe_source_table(context: dg.AssetExecutionContext, postgres: PostgresSourcesResource) -> dg.ObserveResult:
        try:
            with postgres.connect(table.source) as conn:
                described = describe_table(conn, table.schema_name, table.table_name)
                key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
                exact = described.estimated_rows <= EXACT_COUNT_LIMIT
                rows = _count_rows(conn, described) if exact else described.estimated_rows
                slot = slot_position(conn, config.slot_for(table.source))
        except SourceTableError as exc:
            # fatal: retrying cannot help until someone changes the table or the config
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        except psycopg.OperationalError as exc:
            raise dg.Failure(description=connection_failure(config, table, exc)) from None
        context.log.info(
            f"{table.key}: {rows} rows ({'exact' if exact else 'estimated'}), "
            f"{len(described.columns)} columns, schema {described.schema_hash()}"
        )
        return dg.ObserveResult(
            asset_key=spec.key,
            data_version=dg.DataVersion(f"{described.schema_hash()}:{rows}"),
            metadata={**observation_metadata(described, key, rows, exact), **slot_metadata(slot)},
        )

    return cast(dg.AssetsDefinition, observe_source_table)


def build_polled_observation(config: PlatformConfig, table: TableConfig, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    """A polled (jdbc) table: columns as mapped, key, row count, and where polling stands
    (the stored cursor, rows published, seconds since the cursor last moved)."""

    @dg.multi_observable_source_asset(
        specs=[spec],
        name=f"observe_{table.source}_{table.dagster_name}",
        description=f"Observe {table.key} in its source database and its polling cursor.",
    )
    def observe_source_table(context: dg.AssetExecutionContext, jdbc: JdbcSourcesResource) -> dg.ObserveResult:
        try:
            conn = jdbc.connect(table.source)
        except pymysql.err.MySQLError as exc:
            error = classify_mysql_error(exc, table.source, config.jdbc(table.source))
            raise dg.Failure(description=str(error), allow_retries=error.retriable) from None
        try:
            described, _ = describe_mysql_table(conn, table.schema_name, table.table_name)
            key = resolve_key(described, table.primary_key, f"tables[{table.key}].primary_key")
            exact = described.estimated_rows <= EXACT_COUNT_LIMIT
            rows = described.estimated_rows
            if exact:
                with conn.cursor() as cur:
                    cur.execute(
                        f"SELECT COUNT(*) FROM {quote_mysql(table.schema_name)}.{quote_mysql(table.table_name)}"
                    )
                    counted = cur.fetchone()
                    rows = int(counted[0]) if counted else 0
        except SourceTableError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        finally:
            conn.close()
        cursor = read_stored_cursors(config, table.source).get(table.key)
        context.log.info(
            f"{table.key}: {rows} rows, {len(described.columns)} columns, schema {described.schema_hash()}"
        )
        return dg.ObserveResult(
            asset_key=spec.key,
            data_version=dg.DataVersion(f"{described.schema_hash()}:{rows}"),
            metadata={**observation_metadata(described, key, rows, exact), **cursor_metadata(cursor)},
        )

    return cast(dg.AssetsDefinition, observe_source_table)


def cursor_metadata(cursor: TableCursor | None) -> dict[str, Any]:
    if cursor is None:
        return {"poll_cursor": dg.MetadataValue.text("none stored (the poller has not run yet)")}
    metadata: dict[str, Any] = {
        "poll_cursor": dg.MetadataValue.text(cursor.describe()),
        "poll_rows_published": dg.MetadataValue.int(cursor.rows),
        "poll_position": dg.MetadataValue.int(cursor.position),
    }
    if cursor.committed_at:
        age = (datetime.now(UTC) - datetime.fromisoformat(cursor.committed_at)).total_seconds()
        metadata["poll_cursor_age_s"] = dg.MetadataValue.float(round(age, 3))
    return metadata


def current_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name])


def history_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "history"])


def build_current_asset(config: PlatformConfig, table: TableConfig) -> dg.AssetsDefinition:
    specs = [
        dg.AssetSpec(
            key=current_asset_key(table),
            group_name=group_name(table),
            kinds={"spark", "delta"},
            deps=[snapshot_asset_key(table), changelog_asset_key(table)],
            description=(
                f"{table.key} as it is in the source: the latest snapshot generation, then every change after "
                "its watermark in source commit order, deletes applied, duplicates harmless. Incremental: each "
                "run applies only the changelog offsets recorded since the last one."
            ),
            metadata={"lake_path": current_path(config, table)},
            tags={"cdc/source": table.source},
            automation_condition=CURRENT_AUTOMATION,
        )
    ]
    if table.history:
        # written by the same run from the same change batch: one position for both
        specs.append(
            dg.AssetSpec(
                key=history_asset_key(table),
                group_name=group_name(table),
                kinds={"spark", "delta"},
                deps=[snapshot_asset_key(table), changelog_asset_key(table)],
                description=(
                    f"SCD type 2 history of {table.key}: one version per change with valid_from / valid_to "
                    "(source commit times) and is_current; never thrown away by a new generation."
                ),
                metadata={"lake_path": history_path(config, table)},
                tags={"cdc/source": table.source},
                automation_condition=CURRENT_AUTOMATION,
            )
        )

    key = current_asset_key(table)
    check_specs = [
        dg.AssetCheckSpec(
            SCHEMA_CHECK,
            asset=key,
            blocking=True,
            description=(
                f"The source schema against the registered schema history under {table.compatibility.value}; "
                "evaluated before anything is merged (an incompatible change merges nothing). Pandera schemas "
                "generated from the table's schema validate current (types, nullability, key columns)."
            ),
        ),
        dg.AssetCheckSpec(
            KEYS_CHECK,
            asset=key,
            blocking=True,
            description=(
                "Primary key non-null and unique in current; Kafka keys of recent events hold exactly the key "
                "columns and are the same text for every event of a row."
            ),
        ),
        dg.AssetCheckSpec(
            COMPLETENESS_CHECK,
            asset=key,
            description=(
                "Changelog windows cover every offset since the watermark; dead letters per window within the "
                "threshold; current reconciles with the source (row count, checksum) when the position allows "
                "an exact comparison."
            ),
        ),
    ]

    @dg.multi_asset(
        name=f"{table.source}__{table.dagster_name}__current",
        specs=specs,
        check_specs=check_specs,
        retry_policy=RETRY_POLICY,
    )
    def current(context: dg.AssetExecutionContext, pyspark: PySparkResource) -> Iterator[Any]:
        spark = pyspark.spark_session
        generation, rebuilding = pending_generation(spark, config, table)
        if generation is None:
            raise dg.Failure(
                description=f"{table.key} has no snapshot generation yet; run: cdc-platform snapshot {table.key}",
                allow_retries=False,
            )
        try:
            schema = check_schema(spark, config, table, generation, new_baseline=rebuilding)
        except (SourceTableError, MissingSecretError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        if schema.change is not None and not schema.change.compatible:
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=SCHEMA_CHECK,
                passed=False,
                metadata=schema_check_metadata(schema),
                description="; ".join(schema.change.problems),
            )
            raise dg.Failure(
                description=(
                    f"{table.key}: incompatible schema change under {schema.compatibility} "
                    f"({'; '.join(schema.change.problems)}). Nothing was merged. The rehydration sensor takes "
                    f"a new generation (reason schema_incompatible); or run: cdc-platform rehydrate {table.key}"
                ),
                metadata={"reason": "schema_incompatible"},
                allow_retries=False,
            )
        try:
            result = apply_changes(spark, config, table)
        except (CurrentStateError, SnapshotError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        if result.waiting_for:
            context.log.warning(f"{table.key}: waiting for changelog windows: {', '.join(result.waiting_for)}")
        yield dg.MaterializeResult(asset_key=key, metadata=current_metadata(result, config.is_polled(table)))
        if result.history is not None:
            yield dg.MaterializeResult(
                asset_key=history_asset_key(table),
                metadata={
                    "versions_opened": dg.MetadataValue.int(result.history.versions_opened),
                    "versions_closed": dg.MetadataValue.int(result.history.versions_closed),
                    "generation": dg.MetadataValue.text(result.generation),
                },
            )
        frame = spark.read.format("delta").load(current_path(config, table))
        observed = schema.observed
        assert observed is not None  # check_schema read it before anything was merged
        key_columns = list(observed.primary_key)
        nullable = {c.name: c.nullable for c in observed.columns}
        schema.pandera_errors = pandera_errors(frame, nullable, key_columns)
        yield dg.AssetCheckResult(
            asset_key=key,
            check_name=SCHEMA_CHECK,
            passed=schema.passed,
            metadata=schema_check_metadata(schema),
            description="; ".join(schema.pandera_errors[:5]) or None,
        )
        keys = check_keys(spark, frame, recent_changelog(spark, config, table), key_columns)
        yield dg.AssetCheckResult(
            asset_key=key,
            check_name=KEYS_CHECK,
            passed=keys.passed,
            metadata={
                "rows_checked": dg.MetadataValue.int(keys.rows),
                "null_keys": dg.MetadataValue.int(keys.null_keys),
                "duplicate_keys": dg.MetadataValue.int(keys.duplicate_keys),
                "mismatches": dg.MetadataValue.int(keys.null_keys + keys.duplicate_keys),
                "kafka_events_checked": dg.MetadataValue.int(keys.kafka_events_checked),
                "kafka_key_mismatches": dg.MetadataValue.int(keys.kafka_key_mismatches),
                "kafka_unstable_rows": dg.MetadataValue.int(keys.kafka_unstable_rows),
                "sample_keys": dg.MetadataValue.json(keys.sample + keys.kafka_sample),
            },
        )
        completeness = check_completeness(
            spark, config, table, frame.drop(*POSITION_COLUMNS), result.frontier, result.applied_commit_lsn
        )
        hard_deleted = completeness.passed and completeness.deleted_in_source > 0
        yield dg.AssetCheckResult(
            asset_key=key,
            check_name=COMPLETENESS_CHECK,
            # rows a polled source hard-deleted: a warning, fixed by the next reconciliation generation
            passed=completeness.passed and not hard_deleted,
            severity=dg.AssetCheckSeverity.WARN if hard_deleted else dg.AssetCheckSeverity.ERROR,
            description=(
                f"{completeness.deleted_in_source} row(s) exist in current but no longer in the source (hard "
                "deletes, which polling cannot see); the next reconciliation generation drops them"
                if hard_deleted
                else None
            ),
            metadata={
                "deleted_in_source": dg.MetadataValue.int(completeness.deleted_in_source),
                "rows_dropped_by_generation": dg.MetadataValue.int(result.dropped_by_generation or 0),
                "offsets_missing": dg.MetadataValue.int(completeness.offsets_missing),
                "holes": dg.MetadataValue.json(completeness.holes[:10]),
                "dead_letters": dg.MetadataValue.int(completeness.dead_letters),
                "max_dead_letters_per_window": dg.MetadataValue.int(completeness.max_dead_letters_per_window),
                "dead_letter_threshold": dg.MetadataValue.int(completeness.dead_letter_threshold),
                "reconciled": dg.MetadataValue.bool(completeness.compared),
                "reconcile_note": dg.MetadataValue.text(completeness.compare_note),
                "rows_checked": dg.MetadataValue.int(completeness.current_rows),
                "source_rows": dg.MetadataValue.int(completeness.source_rows),
                "missing_rows": dg.MetadataValue.int(completeness.missing),
                "extra_rows": dg.MetadataValue.int(completeness.extra),
                "mismatches": dg.MetadataValue.int(completeness.missing + completeness.extra),
                "sample_keys": dg.MetadataValue.json(completeness.sample),
            },
        )

    return current


def current_metadata(result: CurrentResult, polled: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rows": dg.MetadataValue.int(result.rows),
        "changes_applied": dg.MetadataValue.int(result.changes_applied),
        "rebuilt": dg.MetadataValue.bool(result.rebuilt),
        "generation": dg.MetadataValue.text(result.generation),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "frontier": dg.MetadataValue.json({str(p): o for p, o in result.frontier.items()}),
    }
    if result.dropped_by_generation is not None:
        metadata["rows_dropped_by_generation"] = dg.MetadataValue.int(result.dropped_by_generation)
        metadata["dropped_sample"] = dg.MetadataValue.json(result.dropped_sample)
    if result.applied_commit_lsn is not None:
        metadata["last_applied_lsn"] = dg.MetadataValue.text(position_text(result.applied_commit_lsn, polled))
    if result.last_source_ts is not None:
        commit = datetime.fromisoformat(result.last_source_ts)
        commit = commit if commit.tzinfo else commit.replace(tzinfo=UTC)
        metadata["last_source_commit"] = dg.MetadataValue.timestamp(commit)
        metadata["freshness_lag_s"] = dg.MetadataValue.float((datetime.now(UTC) - commit).total_seconds())
    return metadata


def schema_check_metadata(report: SchemaReport) -> dict[str, Any]:
    change = report.change
    return {
        "schema_version": dg.MetadataValue.int(report.version),
        "registered_new_version": dg.MetadataValue.bool(report.registered),
        "compatibility": dg.MetadataValue.text(report.compatibility),
        "change": dg.MetadataValue.text(change.summary() if change else "none"),
        "incompatibilities": dg.MetadataValue.int(len(change.problems) if change else 0),
        "offending_columns": dg.MetadataValue.json(
            sorted({*change.added, *change.dropped, *(r.split(":")[0] for r in change.retyped)}) if change else []
        ),
        "pandera_errors": dg.MetadataValue.int(len(report.pandera_errors)),
        "pandera_sample": dg.MetadataValue.json(report.pandera_errors[:5]),
    }


def changelog_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "changelog"])


def changelog_partitions(table: TableConfig) -> dg.TimeWindowPartitionsDefinition:
    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=table.changelog.cron_schedule(),
        start=table.changelog.start,
        fmt="%Y-%m-%dT%H:%M",
        timezone="UTC",
    )


def build_changelog_asset(config: PlatformConfig, table: TableConfig) -> dg.AssetsDefinition:
    @dg.asset(
        key=changelog_asset_key(table),
        group_name=group_name(table),
        kinds={"spark", "delta", "kafka"},
        partitions_def=changelog_partitions(table),
        retry_policy=RETRY_POLICY,
        deps=[source_asset_key(table)],
        description=(
            f"Change events of {table.key} from Kafka topic {config.topic_for(table)}, one partition per "
            f"{table.changelog.window} window: offset ranges fixed once per window, read in parallel, decoded "
            "into typed columns; undecodable records go to the dead-letter table per errors.tolerance."
        ),
        metadata={"lake_path": changelog_path(config, table), "topic": config.topic_for(table)},
        tags={"cdc/source": table.source},
    )
    def changelog(context: dg.AssetExecutionContext, pyspark: PySparkResource) -> dg.MaterializeResult[None]:
        window = context.partition_time_window
        try:
            result = materialize_window(pyspark.spark_session, config, table, window.start, window.end)
        except WindowNotClosedError as exc:
            raise dg.Failure(description=str(exc)) from None  # retriable: it closes with time
        except ChangelogGapError as exc:
            raise dg.Failure(description=str(exc), metadata={"reason": exc.reason}, allow_retries=False) from None
        except (DeadLetterError, SourceTableError, MissingSecretError, SnapshotError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        context.log.info(f"{table.key} window {result.window_start}: {result.rows} events {result.events}")
        return dg.MaterializeResult(metadata=changelog_metadata(result, config.is_polled(table)))

    return changelog


def changelog_metadata(result: WindowResult, polled: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "events": dg.MetadataValue.int(result.rows),
        "dead_letters": dg.MetadataValue.int(result.dead_letters),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "reused_ranges": dg.MetadataValue.bool(result.reused_ranges),
        "offset_ranges": dg.MetadataValue.json({str(r.partition): [r.start, r.end] for r in result.ranges}),
        "offsets": dg.MetadataValue.int(sum(r.end - r.start for r in result.ranges)),
    }
    for op in ("c", "u", "d", "t", "r", "tombstone"):
        metadata[f"events_{op}"] = dg.MetadataValue.int(result.events.get(op, 0))
    if result.min_commit_lsn is not None and result.max_commit_lsn is not None:
        metadata["min_commit_lsn"] = dg.MetadataValue.text(position_text(result.min_commit_lsn, polled))
        metadata["max_commit_lsn"] = dg.MetadataValue.text(position_text(result.max_commit_lsn, polled))
    return metadata


def position_text(position: int, polled: bool) -> str:
    """A source position as users know it: an LSN, or a polled source's database clock."""
    if polled:
        return f"{datetime.fromtimestamp(position / 1e9, UTC).isoformat()} (poll position {position})"
    return format_lsn(position)


def connection_failure(config: PlatformConfig, table: TableConfig, exc: psycopg.OperationalError) -> str:
    """The same words capture uses: libpq's message (never the password) and the fix."""
    return str(classify_postgres_error(exc, source=table.source, user=config.sources[table.source].user))


def snapshot_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "snapshot"])


def generations_partitions(table: TableConfig) -> dg.DynamicPartitionsDefinition:
    """One partition per snapshot generation (the first bootstrap, then each rehydration)."""
    return dg.DynamicPartitionsDefinition(name=f"{group_name(table)}_generations")


def new_generation_key() -> str:
    """Generation keys sort by time: the latest generation is the greatest key."""
    return datetime.now(UTC).strftime("g%Y%m%dT%H%M%SZ")


def build_snapshot_asset(config: PlatformConfig, table: TableConfig) -> dg.AssetsDefinition:
    @dg.asset(
        key=snapshot_asset_key(table),
        group_name=group_name(table),
        kinds={"spark", "delta", "postgres"},
        partitions_def=generations_partitions(table),
        retry_policy=RETRY_POLICY,
        deps=[source_asset_key(table)],
        description=(
            f"Snapshot generations of {table.key}: a consistent parallel read (Spark JDBC, one exported "
            "MVCC snapshot for every partition) into Delta, with the watermark (source LSN and Kafka end "
            "offsets) taken just before. One partition per generation."
        ),
        metadata={"lake_path": f"{table_root(config, table)}/snapshot/<generation>"},
        tags={"cdc/source": table.source},
    )
    def snapshot(context: dg.AssetExecutionContext, pyspark: PySparkResource) -> dg.MaterializeResult[None]:
        generation = context.partition_key
        reason = context.run.tags.get("cdc/reason", "manual")
        if reason == "source_position_lost":
            try:
                context.log.info(prepare_new_slot(config, table.source))
            except psycopg.OperationalError as exc:
                raise dg.Failure(description=connection_failure(config, table, exc)) from None
        try:
            result = take_snapshot(pyspark.spark_session, config, table, generation, log_progress=context.log.info)
        except (SourceTableError, MissingSecretError, SnapshotError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        except psycopg.OperationalError as exc:
            raise dg.Failure(description=connection_failure(config, table, exc)) from None
        except pymysql.err.MySQLError as exc:
            error = classify_mysql_error(exc, table.source, config.jdbc(table.source))
            raise dg.Failure(description=str(error), allow_retries=error.retriable) from None
        metadata = snapshot_metadata(result, config.is_polled(table))
        metadata["rehydration_reason"] = dg.MetadataValue.text(reason)
        if "cdc/detail" in context.run.tags:
            metadata["rehydration_detail"] = dg.MetadataValue.text(context.run.tags["cdc/detail"])
        return dg.MaterializeResult(metadata=metadata)

    return snapshot


def snapshot_metadata(result: SnapshotResult, polled: bool = False) -> dict[str, Any]:
    return {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rows": dg.MetadataValue.int(result.rows),
        "source_rows": dg.MetadataValue.int(result.source_rows),
        "bytes": dg.MetadataValue.int(result.bytes),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "spark_partitions": dg.MetadataValue.int(result.spark_partitions),
        "watermark_lsn": dg.MetadataValue.text(position_text(result.watermark.lsn, polled)),
        "watermark_lsn_int": dg.MetadataValue.int(result.watermark.lsn),
        "watermark_taken_at": dg.MetadataValue.text(result.watermark.taken_at),
        "watermark_kafka_end_offsets": dg.MetadataValue.json(
            {str(p): o for p, o in result.watermark.kafka_end_offsets.items()}
        ),
        "schema_hash": dg.MetadataValue.text(result.schema_hash),
        "key_columns": dg.MetadataValue.text(", ".join(result.key_columns)),
        "path": dg.MetadataValue.path(result.path),
        "dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(name=name, type=lake_type) for name, lake_type in result.columns]
        ),
    }


def _count_rows(conn: Any, described: SourceTable) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(described.schema), sql.Identifier(described.name)
    )
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def observation_metadata(described: SourceTable, key: tuple[str, ...], rows: int, exact: bool) -> dict[str, Any]:
    return {
        "dagster/row_count": dg.MetadataValue.int(rows),
        "rows": dg.MetadataValue.int(rows),
        "rows_exact": dg.MetadataValue.bool(exact),
        "columns": dg.MetadataValue.int(len(described.columns)),
        "schema_hash": dg.MetadataValue.text(described.schema_hash()),
        "key_columns": dg.MetadataValue.text(", ".join(key)),
        "replica_identity": dg.MetadataValue.text(described.replica_identity),
        "dagster/column_schema": column_schema(described, key),
    }


def slot_metadata(slot: dict[str, Any] | None) -> dict[str, Any]:
    """Capture's position for the table's source: WAL retained behind the slot is plotted."""
    if slot is None:
        return {"capture_slot": dg.MetadataValue.text("missing (capture has not run, or the slot was lost)")}
    return {
        "capture_confirmed_lsn": dg.MetadataValue.text(str(slot["confirmed_flush_lsn"])),
        "capture_lag_bytes": dg.MetadataValue.int(int(slot["lag_bytes"])),
        "capture_slot_active": dg.MetadataValue.bool(bool(slot["active"])),
        "capture_wal_status": dg.MetadataValue.text(str(slot["wal_status"])),
    }


def column_schema(described: SourceTable, key: tuple[str, ...]) -> dg.TableSchema:
    return dg.TableSchema(
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
