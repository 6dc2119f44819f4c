"""Jobs the sensors request: one per table and kind (a sensor's target may not mix
partitions definitions; the partitions come from the selected asset)."""

from __future__ import annotations

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.orchestration.keys import (
    changelog_asset_key,
    changelog_job_name,
    generation_job_name,
    snapshot_asset_key,
)


def generation_job(table: TableConfig) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        generation_job_name(table),
        selection=[snapshot_asset_key(table)],
        description=f"A snapshot generation of {table.key}.",
    )


def changelog_job(table: TableConfig) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        changelog_job_name(table),
        selection=[changelog_asset_key(table)],
        description=f"A changelog window of {table.key}.",
    )
