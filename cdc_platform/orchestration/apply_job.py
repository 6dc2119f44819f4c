"""The scheduled mode of the stream apply: a Dagster run applies everything available for
one source and stops (``cdc-platform apply --once``, Structured Streaming's ``AvailableNow``),
for users who want no long-running Spark. Same code as the continuous process
(``lake.apply.StreamApply``), on the session of the platform's PySpark resource; the
run materializes each table's current (and history) and every changelog day it wrote to.

A source's ``apply.schedule`` (cron) starts the job; a tick while a run of it is still
going is skipped, and a continuous ``apply`` of the same source makes the run fail at once
(the source's lease: one apply at a time)."""

import dagster as dg

from cdc_platform.config.model import PlatformConfig
from cdc_platform.lake.apply import StreamApply
from cdc_platform.lake.schema_registry import schema_refresh
from cdc_platform.orchestration.failures import failures_mapped
from cdc_platform.orchestration.keys import apply_job_name
from cdc_platform.orchestration.reporting import RunlessReporter
from cdc_platform.orchestration.resources import CdcSparkResource, KafkaResource, LedgerResource, SourcesResource
from cdc_platform.sources.base import CaptureWatch

IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED]  # fmt: skip


def build_apply_job(config: PlatformConfig, source: str) -> dg.JobDefinition:
    tables = [t.key for t in config.tables_of(source)]

    @dg.op(
        name=f"apply_{source}",
        description=f"Apply what Kafka holds for source '{source}' ({len(tables)} tables) to the lake, then stop.",
        tags={"cdc/source": source, "cdc/kind": "apply"},
    )
    def apply_once(
        context: dg.OpExecutionContext,
        ledger: LedgerResource,
        sources: SourcesResource,
        kafka: KafkaResource,
        pyspark: CdcSparkResource,
    ) -> None:
        platform = ledger.config
        book, clients = ledger.ledger(), kafka.clients()
        lake_tables = [ledger.table(key) for key in tables]
        src = sources.source(source)
        with failures_mapped(f"apply of source {source}"), StreamApply(
            pyspark.spark_session, book, clients, lake_tables, platform.sources[source].apply,
            refresh=lambda t: schema_refresh(book, src, t.config),
        ) as engine:  # fmt: skip
            applied = engine.run_until_caught_up()
        batches = sum(a.batch is not None for a in applied)
        context.log.info(f"source {source}: {batches} micro-batch(es) over {len(tables)} table(s), caught up")
        reporter = RunlessReporter(
            context.instance, lake_tables, src.format_position, emit=context.log_event,
            capture=CaptureWatch({source: src}), positions=engine.positions,
        )  # fmt: skip
        reporter.report_run(applied)

    @dg.job(
        name=apply_job_name(source),
        description=f"The stream apply of source '{source}' in scheduled mode: everything available, then stop.",
        executor_def=dg.in_process_executor,
        tags={"cdc/source": source},
    )
    def apply_job() -> None:
        apply_once()

    return apply_job


def build_apply_schedule(job: dg.JobDefinition, cron: str) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"{job.name}_schedule",
        job=job,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    def every_tick(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        running = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job.name, statuses=IN_FLIGHT), limit=1
        )  # fmt: skip
        if running:
            return dg.SkipReason(f"run {running[0].run_id} of {job.name} is still applying")
        return dg.RunRequest()

    return every_tick
