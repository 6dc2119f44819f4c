"""One factory per captured table, returning that table's ``dg.Definitions``.

Asset keys are ``[<source>, <table>, …]`` and each table is its own asset group, so the
UI shows one group per source table. Today a table contributes the observed source
table; the snapshot, changelog and current-state assets join this group as they land.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import psycopg
from dagster_pyspark import PySparkResource
from psycopg import sql

from cdc_platform.capture.errors import classify_postgres_error
from cdc_platform.capture.pg_catalog import (
    SourceTable,
    SourceTableError,
    describe_table,
    resolve_key,
    slot_position,
)
from cdc_platform.config import MissingSecretError, PlatformConfig, TableConfig
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.resources.postgres import PostgresSourcesResource
from cdc_platform.spark.changelog import (
    ChangelogGapError,
    DeadLetterError,
    WindowNotClosedError,
    WindowResult,
    changelog_path,
    materialize_window,
)
from cdc_platform.spark.current import CurrentStateError, apply_changes, current_path, history_path
from cdc_platform.spark.snapshot import SnapshotError, SnapshotResult, table_root, take_snapshot

# Tables estimated above this are not count(*)-ed on every observation.
EXACT_COUNT_LIMIT = 5_000_000


def group_name(table: TableConfig) -> str:
    return f"{table.source}_{table.dagster_name}"


def source_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "source"])


def build_table_definitions(config: PlatformConfig, table: TableConfig) -> dg.Definitions:
    source = config.sources[table.source]
    spec = dg.AssetSpec(
        key=source_asset_key(table),
        group_name=group_name(table),
        kinds={"postgres"},
        description=(
            f"Source table {table.schema_name}.{table.table_name} in PostgreSQL database "
            f"'{source.database}' ({source.host}:{source.port}). Observed: columns, key, replica "
            "identity and row count; the data version changes with the schema and row count."
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

    snapshot = build_snapshot_asset(config, table)
    changelog = build_changelog_asset(config, table)
    current = build_current_asset(config, table)
    return dg.Definitions(assets=[observe_source_table, snapshot, changelog, current])


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
            )
        )

    @dg.multi_asset(name=f"{table.source}__{table.dagster_name}__current", specs=specs)
    def current(context: dg.AssetExecutionContext, pyspark: PySparkResource) -> Iterator[dg.MaterializeResult[None]]:
        try:
            result = apply_changes(pyspark.spark_session, config, table)
        except CurrentStateError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        if result.waiting_for:
            context.log.warning(f"{table.key}: waiting for changelog windows: {', '.join(result.waiting_for)}")
        metadata: dict[str, Any] = {
            "dagster/row_count": dg.MetadataValue.int(result.rows),
            "rows": dg.MetadataValue.int(result.rows),
            "changes_applied": dg.MetadataValue.int(result.changes_applied),
            "rebuilt": dg.MetadataValue.bool(result.rebuilt),
            "generation": dg.MetadataValue.text(result.generation),
            "duration_s": dg.MetadataValue.float(result.duration_s),
            "frontier": dg.MetadataValue.json({str(p): o for p, o in result.frontier.items()}),
        }
        if result.applied_commit_lsn is not None:
            metadata["last_applied_lsn"] = dg.MetadataValue.text(format_lsn(result.applied_commit_lsn))
        if result.last_source_ts is not None:
            commit = datetime.fromisoformat(result.last_source_ts)
            commit = commit if commit.tzinfo else commit.replace(tzinfo=UTC)
            metadata["last_source_commit"] = dg.MetadataValue.timestamp(commit)
            metadata["freshness_lag_s"] = dg.MetadataValue.float((datetime.now(UTC) - commit).total_seconds())
        yield dg.MaterializeResult(asset_key=current_asset_key(table), metadata=metadata)
        if result.history is not None:
            yield dg.MaterializeResult(
                asset_key=history_asset_key(table),
                metadata={
                    "versions_opened": dg.MetadataValue.int(result.history.versions_opened),
                    "versions_closed": dg.MetadataValue.int(result.history.versions_closed),
                    "generation": dg.MetadataValue.text(result.generation),
                },
            )

    return current


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
        except (DeadLetterError, SourceTableError, MissingSecretError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        context.log.info(f"{table.key} window {result.window_start}: {result.rows} events {result.events}")
        return dg.MaterializeResult(metadata=changelog_metadata(result))

    return changelog


def changelog_metadata(result: WindowResult) -> dict[str, Any]:
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
        metadata["min_commit_lsn"] = dg.MetadataValue.text(format_lsn(result.min_commit_lsn))
        metadata["max_commit_lsn"] = dg.MetadataValue.text(format_lsn(result.max_commit_lsn))
    return metadata


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
        try:
            result = take_snapshot(pyspark.spark_session, config, table, generation, log_progress=context.log.info)
        except (SourceTableError, MissingSecretError, SnapshotError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        except psycopg.OperationalError as exc:
            raise dg.Failure(description=connection_failure(config, table, exc)) from None
        return dg.MaterializeResult(metadata=snapshot_metadata(result))

    return snapshot


def snapshot_metadata(result: SnapshotResult) -> dict[str, Any]:
    return {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rows": dg.MetadataValue.int(result.rows),
        "source_rows": dg.MetadataValue.int(result.source_rows),
        "bytes": dg.MetadataValue.int(result.bytes),
        "duration_s": dg.MetadataValue.float(result.duration_s),
        "spark_partitions": dg.MetadataValue.int(result.spark_partitions),
        "watermark_lsn": dg.MetadataValue.text(format_lsn(result.watermark.lsn)),
        "watermark_lsn_int": dg.MetadataValue.int(result.watermark.lsn),
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
