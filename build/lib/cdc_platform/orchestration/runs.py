"""Dagster runs started from the command line (``cdc-platform snapshot``, ``current``,
``rehydrate``): the same jobs the sensors request, recorded in the instance the UI reads
(``$DAGSTER_HOME``), with the reason in the run's tags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.errors import FatalError
from cdc_platform.model.generations import Generation, GenerationEvent, GenerationStatus
from cdc_platform.orchestration.definitions import build_definitions
from cdc_platform.orchestration.keys import (
    TAG_CAUSE,
    TAG_GENERATION,
    TAG_KIND,
    TAG_REASON,
    TAG_TABLE,
    current_keys,
    generation_job_name,
)
from cdc_platform.orchestration.partitions import generations_partitions
from cdc_platform.orchestration.resources import cached_config
from cdc_platform.orchestration.sensors.rehydration import new_generation_key


@dataclass
class GenerationRun:
    table: str
    generation: str
    success: bool
    run_id: str
    rows: int | None


def start_generations(
    config_path: str | Path, tables: list[TableConfig], reason: str, if_missing: bool = False,
    instance: dg.DagsterInstance | None = None, resume: bool = False,
) -> list[GenerationRun]:  # fmt: skip
    """A new generation (dynamic partition) per table, materialized by the table's
    generation job. ``if_missing``: only tables without a committed generation.
    ``resume``: run the table's interrupted chunked generation again instead (its
    partition, its reason and cause); it reads only the chunks it had not written."""
    instance = instance or dg.DagsterInstance.get()
    path = str(Path(config_path).resolve())
    defs = build_definitions(path)
    ledger = Ledger(cached_config(path).lake.root)
    runs = []
    for table in tables:
        if if_missing and ledger.committed(table.key) is not None:
            continue
        if resume:
            interrupted = resumable_generation(ledger, table)
            generation, reason, cause = interrupted.generation, interrupted.reason, interrupted.cause
        else:
            generation = new_generation_key()
            cause = f"cli:{generation}"
            ledger.record_generation(
                GenerationEvent(table.key, generation, GenerationStatus.REQUESTED, reason=reason, cause=cause)
            )
        name = generations_partitions(table).name
        assert name is not None
        instance.add_dynamic_partitions(name, [generation])
        job = defs.resolve_job_def(generation_job_name(table))
        tags = {
            TAG_REASON: reason,
            TAG_TABLE: table.key,
            TAG_CAUSE: cause,
            TAG_GENERATION: generation,
            TAG_KIND: "generation",
        }
        result = job.execute_in_process(instance=instance, partition_key=generation, tags=tags, raise_on_error=False)
        runs.append(GenerationRun(table.key, generation, result.success, result.run_id, _rows(result)))
    return runs


def resumable_generation(ledger: Ledger, table: TableConfig) -> Generation:
    """The table's last generation that planned chunks and did not commit."""
    unfinished = [
        g for g in ledger.generations(table.key).values()
        if g.status is not GenerationStatus.COMMITTED and ledger.chunk_progress(table.key, g.generation).plan
    ]  # fmt: skip
    if not unfinished:
        raise FatalError(
            f"{table.key}: no interrupted chunked generation to resume (only snapshot.mode: incremental generations "
            f"that planned their chunks resume); take a new one: cdc-platform snapshot {table.key}"
        )
    return max(unfinished, key=lambda g: g.order)


def _rows(result: dg.ExecuteInProcessResult) -> int | None:
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        value = materialization.metadata.get("rows") if materialization else None
        if value is not None:
            return int(str(value.value))
    return None


def apply_current(
    config_path: str | Path, tables: list[TableConfig], instance: dg.DagsterInstance | None = None
) -> list[tuple[str, bool, str]]:
    """Materialize each table's current state (a Dagster run per table): (table, success, run id)."""
    instance = instance or dg.DagsterInstance.get()
    defs = build_definitions(config_path)
    assets = list(defs.assets or [])
    results = []
    for table in tables:
        result = dg.materialize(
            assets,  # type: ignore[arg-type]
            selection=current_keys(table),
            instance=instance,
            resources=dict(defs.resources or {}),
            tags={TAG_TABLE: table.key, TAG_KIND: "current"},
            raise_on_error=False,
        )
        results.append((table.key, result.success, result.run_id))
    return results
