"""One small asset group per configured table: the observed source table, its snapshot
generations, its changelog windows, and its current state (with history and checks)."""

import dagster as dg

from cdc_platform.config.model import PlatformConfig, TableConfig
from cdc_platform.lake.tables import lake_table
from cdc_platform.orchestration.assets.changelog import build_changelog_asset, build_day_check
from cdc_platform.orchestration.assets.current import build_current_asset
from cdc_platform.orchestration.assets.snapshot import build_snapshot_asset
from cdc_platform.orchestration.assets.source import build_observation, source_spec
from cdc_platform.sources import open_source


def table_assets(config: PlatformConfig, table: TableConfig) -> list[dg.AssetsDefinition]:
    kind = open_source(config, table.source).capabilities.kind_label  # no connection is made
    lake = lake_table(config, table)
    return [
        build_observation(table, source_spec(config, table, kind)),
        build_snapshot_asset(table, kind, lake.root),
        build_changelog_asset(table, lake.topic, lake.root, config.streamed(table)),
        build_current_asset(table, lake.root, config.streamed(table)),
    ]


def table_checks(config: PlatformConfig, table: TableConfig) -> list[dg.AssetChecksDefinition]:
    """Checks defined apart from their asset's step: a streamed changelog's day check (the
    stream apply writes the changelog, and reports the check when it seals a day)."""
    return [build_day_check(table)] if config.streamed(table) else []
