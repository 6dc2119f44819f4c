"""The observed source table: columns, key, row count, and where capture stands for it."""

import warnings
from typing import cast

import dagster as dg

from cdc_platform.config.model import PlatformConfig, TableConfig
from cdc_platform.orchestration.failures import failures_mapped
from cdc_platform.orchestration.keys import group_name, source_asset_key
from cdc_platform.orchestration.metadata import observation_metadata
from cdc_platform.orchestration.resources import SourcesResource


def source_spec(config: PlatformConfig, table: TableConfig, kind: str) -> dg.AssetSpec:
    source = config.sources[table.source]
    how = (
        f"Polled ({table.poll.mode}); hard deletes are not seen by polling"
        if table.poll is not None
        else "Captured by logical decoding"
    )
    return dg.AssetSpec(
        key=source_asset_key(table),
        group_name=group_name(table),
        kinds={kind},
        description=(
            f"Source table {table.schema_name}.{table.table_name} in {kind} database '{source.database}' "
            f"({source.host}:{source.port}). {how}. Observed: columns, key and row count; the data version "
            "changes with the schema and row count."
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


def build_observation(table: TableConfig, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    with warnings.catch_warnings():
        # a deliberate choice (an observable source asset with a spec's group, kinds and
        # metadata); its beta warning filled the daemon's log once per table at every load
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _observation(table, spec)


def _observation(table: TableConfig, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    @dg.multi_observable_source_asset(
        specs=[spec],
        name=f"observe_{table.source}_{table.dagster_name}",
        description=f"Observe {table.key} in its source database.",
    )
    def observe_source_table(context: dg.AssetExecutionContext, sources: SourcesResource) -> dg.ObserveResult:
        with failures_mapped(f"observing {table.key}"):
            observed = sources.source(table.source).observe(table)
        described = observed.described
        context.log.info(
            f"{table.key}: {observed.rows} rows ({'exact' if observed.rows_exact else 'estimated'}), "
            f"{len(described.columns)} columns, schema {described.schema_hash()}"
        )
        return dg.ObserveResult(
            asset_key=spec.key,
            data_version=dg.DataVersion(f"{described.schema_hash()}:{observed.rows}"),
            metadata=observation_metadata(observed),
        )

    return cast(dg.AssetsDefinition, observe_source_table)
