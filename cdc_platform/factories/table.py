"""One factory per captured table, returning that table's ``dg.Definitions``.

Asset keys are ``[<source>, <table>, …]`` and each table is its own asset group, so the
UI shows one group per source table. Today a table contributes the observed source
table; the snapshot, changelog and current-state assets join this group as they land.
"""

from typing import Any

import dagster as dg
import psycopg
from psycopg import sql

from cdc_platform.capture.pg_catalog import (
    SourceTable,
    SourceTableError,
    describe_connection_error,
    describe_table,
    resolve_key,
    slot_position,
)
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.resources.postgres import PostgresSourcesResource

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
            raise dg.Failure(description=describe_connection_error(table.source, exc)) from None
        context.log.info(
            f"{table.key}: {rows} rows ({'exact' if exact else 'estimated'}), "
            f"{len(described.columns)} columns, schema {described.schema_hash()}"
        )
        return dg.ObserveResult(
            asset_key=spec.key,
            data_version=dg.DataVersion(f"{described.schema_hash()}:{rows}"),
            metadata={**observation_metadata(described, key, rows, exact), **slot_metadata(slot)},
        )

    return dg.Definitions(assets=[observe_source_table])


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
