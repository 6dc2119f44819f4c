"""Names in Dagster: asset keys, groups, checks, jobs and run tags (one table's group is
``<source>_<table>``; asset keys are ``[<source>, <table>, …]``)."""

from __future__ import annotations

import dagster as dg

from cdc_platform.config.model import TableConfig

SCHEMA_CHECK = "schema_compatible"
KEYS_CHECK = "keys"
CHANGELOG_KEYS_CHECK = "changelog_keys"  # Kafka keys and records in the changelog (not blocking)
COMPLETENESS_CHECK = "completeness"
HISTORY_CHECK = "open_versions_match_current"
HISTORY_CHAIN_CHECK = "versions_follow_one_another"
DAY_CHECK = "every_offset_once"  # a streamed changelog's day, per partition
FRESH_CHECK = "fresh"  # a streamed current within a minute of the source (not blocking)

# run tags
TAG_TABLE = "cdc/table"
TAG_KIND = "cdc/kind"  # generation | changelog | current
TAG_REASON = "cdc/reason"
TAG_CAUSE = "cdc/cause"
TAG_DETAIL = "cdc/detail"
TAG_GENERATION = "cdc/generation"
TAG_WINDOW = "cdc/window"


def group_name(table: TableConfig) -> str:
    return f"{table.source}_{table.dagster_name}"


def source_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "source"])


def snapshot_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "snapshot"])


def changelog_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "changelog"])


def current_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name])


def history_asset_key(table: TableConfig) -> dg.AssetKey:
    return dg.AssetKey([table.source, table.dagster_name, "history"])


def current_keys(table: TableConfig) -> list[dg.AssetKey]:
    """Current, and history when the table keeps one (written by the same step)."""
    return [current_asset_key(table), *([history_asset_key(table)] if table.history else [])]


def generation_job_name(table: TableConfig) -> str:
    return f"{table.source}__{table.dagster_name}__generation_job"


def changelog_job_name(table: TableConfig) -> str:
    return f"{table.source}__{table.dagster_name}__changelog_job"


def apply_job_name(source: str) -> str:
    """The scheduled mode of a streamed source: its stream apply as one Dagster run."""
    return f"{source}__apply_job"
