"""Partitions: one per snapshot generation (dynamic), one per changelog window (time)."""

from __future__ import annotations

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.model.windows import PARTITION_FORMAT
from cdc_platform.orchestration.keys import group_name


def generations_partitions(table: TableConfig) -> dg.DynamicPartitionsDefinition:
    """One partition per snapshot generation (the first bootstrap, then each rehydration).
    Any name works (the sensor's, the CLI's, one typed in the launchpad): the ledger
    orders generations by when they were taken, never by name."""
    return dg.DynamicPartitionsDefinition(name=f"{group_name(table)}_generations")


def changelog_partitions(table: TableConfig) -> dg.TimeWindowPartitionsDefinition:
    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=table.changelog.cron_schedule(), start=table.changelog.start, fmt=PARTITION_FORMAT, timezone="UTC"
    )
