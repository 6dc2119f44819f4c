"""``rehydration``: starts a new snapshot generation when a table needs one, with the
reason in the run's tags (``model.rehydration`` decides; this gathers the facts).

Facts come from the ledger (generations, windows, what current was built from), Kafka
(earliest offsets still held), the sources (a lost replication slot, signal rows),
Dagster's check results on current and run states. Each generation records the cause
that asked for it, so a cause starts one generation; a generation in flight blocks
another for that table, and one whose run died or failed no longer counts as in flight.
A chunked generation whose run failed or died is resumed (the same partition, a new run
key per failure): it reads only the chunks it had not written.
"""

import os
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from cdc_platform.config.model import SnapshotMode, TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.delta_rs import table_exists
from cdc_platform.lake.ledger import LedgerState
from cdc_platform.model.coverage import lost_offsets, walk
from cdc_platform.model.generations import Generation, GenerationEvent, GenerationStatus, in_flight
from cdc_platform.model.rehydration import (
    FailedCheck,
    Need,
    TableFacts,
    choose,
    interrupted_generation,
    needs,
    pending_signals,
    repaired_by_a_generation,
)
from cdc_platform.orchestration.jobs import generation_job
from cdc_platform.orchestration.keys import (
    COMPLETENESS_CHECK,
    KEYS_CHECK,
    SCHEMA_CHECK,
    TAG_DETAIL,
    TAG_GENERATION,
    TAG_KIND,
    current_asset_key,
    generation_job_name,
    snapshot_asset_key,
)
from cdc_platform.orchestration.partitions import generations_partitions
from cdc_platform.orchestration.resources import KafkaResource, LedgerResource, SourcesResource
from cdc_platform.orchestration.sensors.runs import RunsInProgress, run_states, runs_in_progress


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_generation_key() -> str:
    """A readable, unique generation name; order comes from the ledger, never from names."""
    return datetime.now(UTC).strftime("g%Y%m%dT%H%M%SZ") + f"-{os.urandom(2).hex()}"


CURRENT_CHECKS = (SCHEMA_CHECK, KEYS_CHECK, COMPLETENESS_CHECK)
CheckExecution = Any  # the instance's check execution record (its class is not in Dagster's public API)


def current_check_keys(table: TableConfig) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(current_asset_key(table), name) for name in CURRENT_CHECKS]


def latest_check_executions(
    instance: dg.DagsterInstance, tables: list[TableConfig]
) -> dict[dg.AssetCheckKey, CheckExecution]:
    """The latest evaluation of every table's current checks, in one question to the instance."""
    keys = [key for table in tables for key in current_check_keys(table)]
    return dict(instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)) if keys else {}


def failed_checks(
    latest_executions: dict[dg.AssetCheckKey, CheckExecution], table: TableConfig, after: datetime
) -> list[FailedCheck]:
    """Checks on current whose latest evaluation failed with ERROR severity after ``after``
    (a warning — a polled source's hard deletes — is reconciliation's job), on findings a
    generation repairs (``model.rehydration.repaired_by_a_generation``)."""
    found = []
    for check_key in current_check_keys(table):
        name = check_key.name
        latest = latest_executions.get(check_key)
        if latest is None or latest.status.value != "FAILED" or latest.event is None:
            continue
        if latest.create_timestamp < after.timestamp():
            continue  # evaluated before the committed generation: that generation was the remedy
        evaluation = latest.event.dagster_event.event_specific_data if latest.event.dagster_event else None
        if getattr(evaluation, "severity", None) == dg.AssetCheckSeverity.WARN:
            continue
        counts = {k: getattr(v, "value", v) for k, v in (getattr(evaluation, "metadata", None) or {}).items()}
        if not repaired_by_a_generation(counts):
            continue  # the changelog's or the source's: the check's description names the fix
        description = getattr(evaluation, "description", None) or f"check {name} failed"
        found.append(FailedCheck(name, latest.run_id, str(description)))
    return found


class FactsGatherer:
    """One tick's facts: each source asked once; Kafka and the instance once for every
    table with a generation (with 200 tables, asking per table took seconds a tick)."""

    def __init__(
        self, context: dg.SensorEvaluationContext, state: LedgerState, kafka: KafkaResource, sources: SourcesResource,
        tables: list[TableConfig], topics: dict[str, str],
    ) -> None:  # fmt: skip
        self.context, self.state, self.kafka, self.sources = context, state, kafka.clients(), sources
        built = [t for t in tables if (c := state.committed(t.key)) is not None and c.watermark is not None]
        self.watermarks = self.kafka.watermarks_of([topics[t.key] for t in built])
        self.check_executions = latest_check_executions(context.instance, built)
        self.lost = {name: sources.source(name).position_lost() for name in sources.names()}
        self.signals: dict[str, list[str]] = {}
        for name in sources.names():
            for signal in sources.source(name).signals():
                for table_key in signal.tables:
                    self.signals.setdefault(table_key, []).append(signal.cause)

    def facts(self, table: TableConfig, topic: str, current_exists: bool) -> TableFacts:
        generations = list(self.state.generations.get(table.key, {}).values())
        committed = self.state.committed(table.key)
        signals = pending_signals(self.signals.get(table.key, []), generations)
        if committed is None or committed.watermark is None:
            return TableFacts(table.key, generations, None, signals=signals)
        ranges = [r.offsets for rs in self.state.windows.get(table.key, {}).values() for r in rs]
        position = self.state.current.get(table.key)
        return TableFacts(
            table=table.key,
            generations=generations,
            committed=committed,
            needed_offsets=walk(committed.watermark.kafka_end_offsets, ranges).frontier,
            kafka_earliest={p: low for p, (low, _) in self.watermarks.get(topic, {}).items()},
            position_lost=self.lost.get(table.source),
            signals=signals,
            current_built=position is not None and position.generation == committed.generation,
            current_exists=current_exists,
            failed_checks=failed_checks(self.check_executions, table, committed.updated_at),
            reconcile_every_s=table.poll.reconcile_every_s() if table.poll else None,
        )


def request_resume(table: TableConfig, need: Need, interrupted: Generation) -> dg.RunRequest:
    """A run of the interrupted generation's partition; one per failure of it (the run key),
    so a request the daemon already launched is not launched again."""
    return dg.RunRequest(
        run_key=f"{table.key}:{need.cause}:resume:{interrupted.generation}:{interrupted.failures}",
        job_name=generation_job_name(table),
        partition_key=interrupted.generation,
        tags={
            **need.tags(), TAG_DETAIL: f"resumed: {need.detail}"[:500], TAG_GENERATION: interrupted.generation,
            TAG_KIND: "generation",
        },
    )  # fmt: skip


def resumable(
    ledger: LedgerResource, table: TableConfig, need: Need, facts: TableFacts, kafka: KafkaClients, topic: str
) -> Generation | None:
    """The need's interrupted generation, when it planned its chunks (``snapshot.mode:
    incremental``) and Kafka still holds every change after the plan's watermark (the
    changes its replay needs; else a new generation)."""
    interrupted = interrupted_generation(need.cause, facts.generations)
    if interrupted is None or table.snapshot.mode is not SnapshotMode.INCREMENTAL:
        return None
    plan = ledger.ledger().chunk_progress(table.key, interrupted.generation).plan
    if plan is None or lost_offsets(plan.watermark.kafka_end_offsets, kafka.earliest_offsets(topic)):
        return None
    return interrupted


def request_generation(
    ledger: LedgerResource, table: TableConfig, need: Need, attempt: int
) -> tuple[dg.RunRequest, dg.AddDynamicPartitionsRequest]:
    generation = new_generation_key()
    ledger.ledger().record_generation(
        GenerationEvent(table.key, generation, GenerationStatus.REQUESTED, reason=need.reason.value, cause=need.cause,
                        covers=need.covers, detail=need.detail[:2000])
    )  # fmt: skip
    request = dg.RunRequest(
        run_key=f"{table.key}:{need.cause}:{attempt}",
        job_name=generation_job_name(table),
        partition_key=generation,
        tags={**need.tags(), TAG_DETAIL: need.detail[:500], TAG_GENERATION: generation, TAG_KIND: "generation"},
    )
    return request, generations_partitions(table).build_add_request([generation])


def decide(
    context: dg.SensorEvaluationContext, table: TableConfig, facts: TableFacts, running: RunsInProgress, now: datetime
) -> tuple[Need | None, int, str]:
    generations = list(facts.generations)
    states = run_states(context.instance, (g.run_id for g in generations if not g.finished))
    queued = len(running.busy(snapshot_asset_key(table), generation_job_name(table)))
    flying = in_flight(generations, states, queued, now)
    decision = choose(needs(facts, now), generations, flying, now)
    return decision.need, decision.attempt, decision.waiting


def build_rehydration_sensor(
    tables: list[TableConfig], topics: dict[str, str], current_paths: dict[str, str]
) -> dg.SensorDefinition:
    @dg.sensor(
        name="rehydration",
        jobs=[generation_job(t) for t in tables],
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Starts a new snapshot generation when a table needs one: bootstrap, changelog gap (Kafka lost "
            "offsets still needed), replication slot lost, incompatible schema, current missing or failing its "
            "checks, a polled table's periodic reconciliation, or a signal row. The reason is in the run's tags; "
            "one cause never starts two generations; a failed one is retried after a growing pause, and a chunked "
            "one that failed or died is resumed (the same partition: it reads only the chunks it had not written)."
        ),
    )
    def rehydration(
        context: dg.SensorEvaluationContext, ledger: LedgerResource, kafka: KafkaResource, sources: SourcesResource
    ) -> dg.SensorResult:
        gatherer = FactsGatherer(context, ledger.ledger().read(), kafka, sources, tables, topics)
        running, now = runs_in_progress(context.instance), utc_now()
        runs, additions, waiting = [], [], []
        for table in tables:
            facts = gatherer.facts(table, topics[table.key], table_exists(current_paths[table.key]))
            need, attempt, why = decide(context, table, facts, running, now)
            if need is None:
                waiting += [f"{table.key}: {why}"] if why else []
                continue
            interrupted = resumable(ledger, table, need, facts, gatherer.kafka, topics[table.key])
            if interrupted is not None:
                runs.append(request_resume(table, need, interrupted))
                context.log.info(
                    f"{table.key}: resuming generation {interrupted.generation} (its run failed or died), "
                    f"reason {need.reason.value}: {need.detail}"
                )
                continue
            request, addition = request_generation(ledger, table, need, attempt)
            runs.append(request)
            additions.append(addition)
            context.log.info(
                f"{table.key}: new generation {request.partition_key}, reason {need.reason.value}: {need.detail}"
            )
        if not runs:
            return dg.SensorResult(skip_reason=dg.SkipReason("; ".join(waiting) or "every table is healthy"))
        return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=additions)

    return rehydration
