"""Snapshot generations: one dynamic partition per generation."""

import dagster as dg

from cdc_platform.config.model import TableConfig
from cdc_platform.lake.snapshot import GenerationRequest, take_generation
from cdc_platform.model.chunks import WaveProgress
from cdc_platform.orchestration.failures import RETRY_POLICY, failures_mapped
from cdc_platform.orchestration.keys import (
    TAG_CAUSE,
    TAG_DETAIL,
    TAG_REASON,
    group_name,
    snapshot_asset_key,
    source_asset_key,
)
from cdc_platform.orchestration.metadata import snapshot_metadata, wave_metadata
from cdc_platform.orchestration.partitions import generations_partitions
from cdc_platform.orchestration.resources import CdcSparkResource, KafkaResource, LedgerResource, SourcesResource


def build_snapshot_asset(table: TableConfig, kind: str, lake_path: str) -> dg.AssetsDefinition:
    @dg.asset(
        key=snapshot_asset_key(table),
        group_name=group_name(table),
        kinds={"spark", "delta", kind},
        partitions_def=generations_partitions(table),
        retry_policy=RETRY_POLICY,
        deps=[source_asset_key(table)],
        description=(
            f"Snapshot generations of {table.key}: the watermark (source position and Kafka end offsets) first, "
            "then a parallel read of key-range chunks (Spark JDBC) into Delta, each chunk in its own short "
            "transaction (snapshot.mode: incremental, resumable) or all in one exported snapshot (exported), "
            "validated, then committed in the ledger. One partition per generation; only committed generations "
            "are used. A chunked generation reports its progress after each wave as an observation."
        ),
        metadata={"lake_path": f"{lake_path}/snapshot/<generation>"},
        tags={"cdc/source": table.source},
    )
    def snapshot(
        context: dg.AssetExecutionContext,
        ledger: LedgerResource,
        sources: SourcesResource,
        kafka: KafkaResource,
        pyspark: CdcSparkResource,
    ) -> dg.MaterializeResult[None]:
        tags = context.run.tags
        request = GenerationRequest(
            generation=context.partition_key,
            reason=tags.get(TAG_REASON, "manual"),
            cause=tags.get(TAG_CAUSE, f"manual:{context.partition_key}"),
            run_id=context.run.run_id,
        )

        def report_wave(progress: WaveProgress) -> None:
            context.log_event(
                dg.AssetObservation(
                    snapshot_asset_key(table), partition=context.partition_key, metadata=wave_metadata(progress)
                )
            )

        with failures_mapped(f"snapshot of {table.key}"):
            result = take_generation(
                pyspark.spark_session, ledger.ledger(), sources.source(table.source), kafka.clients(),
                ledger.table(table.key), request, log_progress=context.log.info, report_wave=report_wave,
            )  # fmt: skip
        return dg.MaterializeResult(metadata=snapshot_metadata(result, request.reason, tags.get(TAG_DETAIL)))

    return snapshot
