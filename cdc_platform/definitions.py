"""The Dagster code location: everything is built from the config file.

``$CDC_PLATFORM_CONFIG`` names the file (default ./cdc_platform.yaml). A bad file fails
the code location load with the same message ``cdc-platform config check`` prints.
"""

from __future__ import annotations

import dagster as dg
from dagster_pyspark import PySparkResource

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.factories.table import (
    build_table_definitions,
    current_asset_key,
    history_asset_key,
    source_asset_key,
)
from cdc_platform.resources import JdbcSourcesResource, PostgresSourcesResource
from cdc_platform.sensors import build_changelog_sensor, build_rehydration_sensor, cdc_run_failures
from cdc_platform.spark.session import prepare_spark_environment, session_conf


def current_keys(config: PlatformConfig) -> list[dg.AssetKey]:
    return [k for t in config.tables for k in [current_asset_key(t), *([history_asset_key(t)] if t.history else [])]]


def build_definitions(config: PlatformConfig) -> dg.Definitions:
    prepare_spark_environment()  # PySparkResource starts Spark in this process
    per_table = [build_table_definitions(config, table) for table in config.tables]
    observe_sources = dg.define_asset_job(
        "observe_sources",
        selection=dg.AssetSelection.assets(*(source_asset_key(t) for t in config.tables)),
        description="Observe every source table: columns, key, replica identity, row count.",
    )
    platform = dg.Definitions(
        # one process per run: its steps (asset, checks) share one Spark session instead of
        # starting a JVM per step
        executor=dg.in_process_executor,
        jobs=[observe_sources],
        sensors=[
            build_changelog_sensor(config),
            build_rehydration_sensor(config),
            cdc_run_failures,
            dg.AutomationConditionSensorDefinition(
                "current_state_automation",
                target=dg.AssetSelection.assets(*current_keys(config)),
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
            )
        ],
        resources={
            "postgres": PostgresSourcesResource.from_config(config),
            "jdbc": JdbcSourcesResource.from_config(config),
            # the session's conf (master, Delta jars, loopback binding) comes from the config
            "pyspark": PySparkResource(spark_config=session_conf(config.spark)),
        },
    )
    return dg.Definitions.merge(*per_table, platform)


defs = build_definitions(load_config())
