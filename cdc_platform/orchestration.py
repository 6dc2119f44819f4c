"""Dagster operations started from the command line (a Dagster edge, like definitions.py):
new snapshot generations, recorded in the instance the UI reads (``$DAGSTER_HOME``)."""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.definitions import build_definitions
from cdc_platform.factories.table import (
    current_asset_key,
    generations_partitions,
    history_asset_key,
    new_generation_key,
    snapshot_asset_key,
)


@dataclass
class GenerationRun:
    table: str
    generation: str
    success: bool
    run_id: str
    rows: int | None


def start_generations(
    config: PlatformConfig,
    tables: list[TableConfig],
    reason: str,
    if_missing: bool = False,
    instance: dg.DagsterInstance | None = None,
) -> list[GenerationRun]:
    """Add a snapshot generation (dynamic partition) per table and materialize it.
    ``reason`` goes into the run's tags (cdc/reason), as the rehydration sensor does."""
    instance = instance or dg.DagsterInstance.get()
    defs = build_definitions(config)
    assets = list(defs.assets or [])
    runs = []
    for table in tables:
        partitions_name = generations_partitions(table).name
        assert partitions_name is not None
        if if_missing and instance.get_dynamic_partitions(partitions_name):
            continue
        generation = new_generation_key()
        instance.add_dynamic_partitions(partitions_name, [generation])
        result = dg.materialize(
            assets,  # type: ignore[arg-type]
            selection=[snapshot_asset_key(table)],
            partition_key=generation,
            instance=instance,
            resources=dict(defs.resources or {}),
            tags={"cdc/reason": reason, "cdc/table": table.key},
            raise_on_error=False,
        )
        rows = None
        for event in result.get_asset_materialization_events():
            materialization = event.materialization
            value = materialization.metadata.get("rows") if materialization else None
            rows = int(str(value.value)) if value is not None else rows
        runs.append(GenerationRun(table.key, generation, result.success, result.run_id, rows))
    return runs


def apply_current(
    config: PlatformConfig, tables: list[TableConfig], instance: dg.DagsterInstance | None = None
) -> list[tuple[str, bool, str]]:
    """Materialize each table's current state (a Dagster run per table): (table, success, run id)."""
    instance = instance or dg.DagsterInstance.get()
    defs = build_definitions(config)
    assets = list(defs.assets or [])
    results = []
    for table in tables:
        result = dg.materialize(
            assets,  # type: ignore[arg-type]
            selection=[current_asset_key(table), *([history_asset_key(table)] if table.history else [])],
            instance=instance,
            resources=dict(defs.resources or {}),
            tags={"cdc/table": table.key},
            raise_on_error=False,
        )
        results.append((table.key, result.success, result.run_id))
    return results
