"""Everything Dagster shows, built from one config file: per-table asset groups, the jobs
and sensors that keep them current, and the resources that own every outside call."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from cdc_platform.config import load_config
from cdc_platform.lake.tables import lake_table
from cdc_platform.orchestration.apply_job import build_apply_job, build_apply_schedule
from cdc_platform.orchestration.assets import table_assets, table_checks
from cdc_platform.orchestration.keys import current_keys, source_asset_key
from cdc_platform.orchestration.resources import platform_resources
from cdc_platform.orchestration.sensors.changelog import build_changelog_sensor
from cdc_platform.orchestration.sensors.failures import cdc_run_failures
from cdc_platform.orchestration.sensors.rehydration import build_rehydration_sensor


def build_definitions(config_path: str | Path) -> dg.Definitions:
    """The code location for the config at ``config_path`` (loaded and validated first:
    a bad file fails the load with the same message ``cdc-platform config check`` prints)."""
    path = str(Path(config_path).resolve())
    config = load_config(path)
    tables = list(config.tables)
    lake = {t.key: lake_table(config, t) for t in tables}
    topics = {key: table.topic for key, table in lake.items()}
    streamed = [name for name in config.sources if any(config.streamed(t) for t in config.tables_of(name))]
    apply_jobs = {name: build_apply_job(config, name) for name in streamed}
    apply_schedules = [
        build_apply_schedule(apply_jobs[name], schedule)
        for name in streamed
        if (schedule := config.sources[name].apply.schedule) is not None
    ]
    observe_sources = dg.define_asset_job(
        "observe_sources",
        selection=dg.AssetSelection.assets(*(source_asset_key(t) for t in tables)),
        description="Observe every source table: columns, key, replica identity, row count.",
    )
    return dg.Definitions(
        assets=[asset for t in tables for asset in table_assets(config, t)],
        asset_checks=[check for t in tables for check in table_checks(config, t)],
        # one process per run: its steps (asset, checks) share one Spark session instead of
        # starting a JVM per step
        executor=dg.in_process_executor,
        jobs=[observe_sources, *apply_jobs.values()],
        sensors=[
            # windows of tables a stream apply writes are never requested (it records its own batches)
            build_changelog_sensor([t for t in tables if not config.streamed(t)], topics),
            build_rehydration_sensor(tables, topics, {key: t.current_path for key, t in lake.items()}),
            cdc_run_failures,
            dg.AutomationConditionSensorDefinition(
                "current_state_automation",
                target=dg.AssetSelection.assets(*(k for t in tables for k in current_keys(t))),
                default_status=dg.DefaultSensorStatus.RUNNING,
                minimum_interval_seconds=30,
                description="Applies new generations and changelog windows to current (and history).",
            ),
        ],
        schedules=[
            dg.ScheduleDefinition(
                name="observe_sources_every_5_minutes",
                job=observe_sources,
                cron_schedule="*/5 * * * *",
                default_status=dg.DefaultScheduleStatus.RUNNING,
            ),
            *apply_schedules,
        ],
        resources=platform_resources(path),
    )
