"""Partitions: one per snapshot generation (dynamic); one per changelog window (time), or,
for a streamed table, one per UTC day its stream apply wrote (dynamic: at most 366 a year)."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.model.windows import PARTITION_FORMAT, parse_window_key, window_key
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


def changelog_days_partitions(table: TableConfig) -> dg.DynamicPartitionsDefinition:
    """A streamed changelog: one partition per UTC day (or hour, ``changelog.partition``) the
    stream apply wrote, added when it writes the partition's first batch. Days before the
    table's first generation, or days nothing was applied, do not exist, so none shows as
    missing; whatever the trigger interval, at most 366 a year (8 784 hourly)."""
    hourly = table.changelog.partition == "hour"
    return dg.DynamicPartitionsDefinition(name=f"{group_name(table)}_changelog_{'hours' if hourly else 'days'}")


DAY_FORMAT, HOUR_FORMAT = "%Y-%m-%d", "%Y-%m-%d-%H:%M"  # Dagster's own daily and hourly keys


def day_partition_key(table: TableConfig, day: str) -> str:
    """The Dagster partition of a streamed changelog partition (``2026-11-25T00:00:00Z`` ->
    ``2026-11-25``; an hourly table's ``2026-11-25T13:00:00Z`` -> ``2026-11-25-13:00``)."""
    return parse_window_key(day).strftime(HOUR_FORMAT if table.changelog.partition == "hour" else DAY_FORMAT)


def day_window_key(partition: str) -> str:
    """The streamed changelog partition of a Dagster partition (``2026-11-25`` -> ``2026-11-25T00:00:00Z``,
    ``2026-11-25-13:00`` -> ``2026-11-25T13:00:00Z``)."""
    fmt = HOUR_FORMAT if len(partition) > len("2026-11-25") else DAY_FORMAT
    return window_key(datetime.strptime(partition, fmt).replace(tzinfo=UTC))
