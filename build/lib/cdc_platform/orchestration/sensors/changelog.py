"""``changelog_windows``: requests each closed changelog window of every table, in order.

Which windows are due is read from the ledger, not remembered in a cursor: from the
window holding the committed generation's watermark on, every window that has ended,
is not recorded and is not being materialized, while it is *closed* (every Kafka
partition has a record at or after its end, or the end plus the table's grace has
passed). A window whose run failed or was killed is due again (a new run key per
attempt). At most ``MAX_WINDOWS_PER_TICK`` per table per tick, so catching up after
downtime comes in bounded batches.
"""

from datetime import UTC, datetime

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.ledger import LedgerState
from cdc_platform.model.windows import due_windows, is_closed, partition_key, window_seconds, window_start
from cdc_platform.orchestration.jobs import changelog_job
from cdc_platform.orchestration.keys import TAG_KIND, TAG_TABLE, TAG_WINDOW, changelog_asset_key, changelog_job_name
from cdc_platform.orchestration.resources import KafkaResource, LedgerResource
from cdc_platform.orchestration.sensors.runs import PARTITION_TAG, RunsInProgress, attempts, runs_in_progress

MAX_WINDOWS_PER_TICK = 24


def windows_to_request(
    table: TableConfig, state: LedgerState, busy: set[str], kafka: KafkaClients, topic: str, now: datetime
) -> list[str]:
    """Partition keys of the table's closed windows that are due, in order, at most MAX_WINDOWS_PER_TICK."""
    committed = state.committed(table.key)
    if committed is None or committed.watermark is None:
        return []  # nothing to apply windows to yet
    size = window_seconds(table.changelog.window)
    first = window_start(committed.watermark.taken_at, size)
    recorded = set(state.windows.get(table.key, {}))
    due = []
    for start, end in due_windows(first, size, recorded, busy, now):
        if not is_closed(end, now, table.changelog.grace_s, kafka.every_partition_past(topic, end)):
            break  # later windows are not closed either
        due.append(partition_key(start))
        if len(due) >= MAX_WINDOWS_PER_TICK:
            break
    return due


def window_request(context: dg.SensorEvaluationContext, table: TableConfig, key: str) -> dg.RunRequest:
    tags = {TAG_TABLE: table.key, TAG_WINDOW: key}
    attempt = attempts(context.instance, {TAG_TABLE: table.key, PARTITION_TAG: key}) + 1
    return dg.RunRequest(
        run_key=f"{table.key}:{key}:{attempt}",
        job_name=changelog_job_name(table),
        partition_key=key,
        tags={**tags, TAG_KIND: "changelog"},
    )


def build_changelog_sensor(tables: list[TableConfig], topics: dict[str, str]) -> dg.SensorDefinition:
    @dg.sensor(
        name="changelog_windows",
        jobs=[changelog_job(t) for t in tables],
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Requests each closed changelog window of every table, in order, never an open one; a window whose run "
            f"failed is requested again; after downtime it catches up at most {MAX_WINDOWS_PER_TICK} windows per "
            "table per tick."
        ),
    )
    def changelog_windows(
        context: dg.SensorEvaluationContext, ledger: LedgerResource, kafka: KafkaResource
    ) -> dg.SensorResult:
        state = ledger.ledger().read()
        running: RunsInProgress = runs_in_progress(context.instance)
        clients, now = kafka.clients(), datetime.now(UTC)
        runs = []
        for table in tables:
            busy = running.busy(changelog_asset_key(table), changelog_job_name(table))
            for key in windows_to_request(table, state, busy, clients, topics[table.key], now):
                runs.append(window_request(context, table, key))
        return dg.SensorResult(run_requests=runs)

    return changelog_windows
