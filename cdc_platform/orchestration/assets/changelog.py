"""The changelog: one time-window partition per window, or, for a streamed table, one
partition per UTC day (reported by the stream apply)."""

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.lake.changelog import materialize_window
from cdc_platform.lake.schema_registry import schema_refresh
from cdc_platform.orchestration.failures import RETRY_POLICY, failures_mapped
from cdc_platform.orchestration.keys import changelog_asset_key, group_name, source_asset_key
from cdc_platform.orchestration.metadata import changelog_metadata
from cdc_platform.orchestration.partitions import changelog_days_partitions, changelog_partitions
from cdc_platform.orchestration.resources import CdcSparkResource, KafkaResource, LedgerResource, SourcesResource


def build_changelog_asset(
    table: TableConfig, topic: str, lake_path: str, streamed: bool = False
) -> dg.AssetsDefinition:
    @dg.asset(
        key=changelog_asset_key(table),
        group_name=group_name(table),
        kinds={"spark", "delta", "kafka"},
        partitions_def=changelog_days_partitions(table) if streamed else changelog_partitions(table),
        retry_policy=RETRY_POLICY,
        deps=[source_asset_key(table)],
        description=_description(table, topic, streamed),
        metadata={"lake_path": f"{lake_path}/changelog", "topic": topic},
        tags={"cdc/source": table.source},
    )
    def changelog(
        context: dg.AssetExecutionContext,
        ledger: LedgerResource,
        sources: SourcesResource,
        kafka: KafkaResource,
        pyspark: CdcSparkResource,
    ) -> dg.MaterializeResult[None]:
        if streamed:
            raise dg.Failure(
                f"{table.key}'s changelog is written by the stream apply of source '{table.source}' (apply.engine: "
                f"stream), in micro-batches it records itself; run: cdc-platform apply --source {table.source}",
                allow_retries=False,
            )
        window = context.partition_time_window
        source = sources.source(table.source)
        book = ledger.ledger()

        refresh_schema = schema_refresh(book, source, table)  # records carry new columns: ask the source

        with failures_mapped(f"changelog window {context.partition_key} of {table.key}"):
            result = materialize_window(
                pyspark.spark_session, book, kafka.clients(), ledger.table(table.key), window.start, window.end,
                refresh_schema,
            )  # fmt: skip
        context.log.info(f"{table.key} window {result.window_start}: {result.rows} events {result.events}")
        return dg.MaterializeResult(metadata=changelog_metadata(result, source.format_position))

    return changelog


def _description(table: TableConfig, topic: str, streamed: bool) -> str:
    decoded = (
        "decoded with the table's registered schema into typed columns; undecodable records go to the "
        "dead-letter table per errors.tolerance."
    )
    if streamed:
        return (
            f"Change events of {table.key} from Kafka topic {topic}, appended by the stream apply of source "
            f"'{table.source}' in micro-batches (offsets planned in the ledger before they are written, Delta "
            f"idempotent appends), {decoded} One partition per UTC day, reported while the day fills and sealed "
            "once it is over: its offset ranges fixed and checked contiguous."
        )
    return (
        f"Change events of {table.key} from Kafka topic {topic}, one partition per {table.changelog.window} "
        f"window: offset ranges fixed once per window (in the ledger), read in parallel, {decoded}"
    )
