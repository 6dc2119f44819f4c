"""Current state (and history), with their checks, in one step and one Spark session."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dagster as dg

from cdc_platform.config.model import TableConfig, period_cron, period_seconds
from cdc_platform.lake.checks import (
    CompletenessInputs,
    check_completeness,
    check_keys,
    pandera_errors,
    recent_changelog,
)
from cdc_platform.lake.compare import compare_history, history_chain
from cdc_platform.lake.current import (
    POSITION_COLUMNS,
    CurrentResult,
    apply_current,
    committed_generation,
    streamed_position,
)
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.schema_registry import SchemaReport, evaluate_schema, registered_report
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import behind
from cdc_platform.model.errors import RetriableError, SchemaIncompatibleError
from cdc_platform.model.tables import TableSchema
from cdc_platform.orchestration.failures import RETRY_POLICY, as_failure, failures_mapped
from cdc_platform.orchestration.keys import (
    CHANGELOG_KEYS_CHECK,
    COMPLETENESS_CHECK,
    FRESH_CHECK,
    HISTORY_CHAIN_CHECK,
    HISTORY_CHECK,
    KEYS_CHECK,
    SCHEMA_CHECK,
    changelog_asset_key,
    current_asset_key,
    group_name,
    history_asset_key,
    snapshot_asset_key,
)
from cdc_platform.orchestration.metadata import (
    chain_check_metadata,
    chain_faults,
    changelog_keys_check_description,
    changelog_keys_check_metadata,
    completeness_check_metadata,
    current_metadata,
    fresh_check_description,
    fresh_check_metadata,
    history_check_metadata,
    history_check_outcome,
    history_metadata,
    is_fresh,
    keys_check_description,
    keys_check_metadata,
    schema_check_metadata,
)
from cdc_platform.orchestration.resources import CdcSparkResource, KafkaResource, LedgerResource, SourcesResource
from cdc_platform.sources.base import CaptureWatch, Source

# current (and history) follow their inputs: a new generation or a new changelog window
CURRENT_AUTOMATION = (
    dg.AutomationCondition.any_deps_updated().since_last_handled() & ~dg.AutomationCondition.in_progress()
).with_label("after a new generation or changelog window")
# A streamed table's current is written by its source's stream apply; a Dagster run reports
# where it stands and evaluates the checks every ``tables[].checks.every`` (never O(table)
# per micro-batch), and materializes the version it checked.
RUN_ALLOWANCE = timedelta(minutes=5)  # a check run's own time, within the freshness windows


def streamed_automation(table: TableConfig) -> dg.AutomationCondition[Any]:
    """A check run at each tick of the table's check period.

    Not ``on_cron``: it also waits for every dependency to be updated since the tick, and the
    snapshot moves only with a new generation, so no check run was requested after the
    first tick. Nor "since last handled": the apply's runless events (every minute) would
    count as the tick handled. A tick stays due until a run is requested for it. Not
    "~missing()" either: the apply only observes current, so until the first check run
    materializes it, current is missing (a run before the apply built current fails,
    naming it)."""
    every = table.checks.every
    return (
        dg.AutomationCondition.cron_tick_passed(period_cron(every)).since(
            dg.AutomationCondition.newly_requested() | dg.AutomationCondition.initial_evaluation()
        )
        & ~dg.AutomationCondition.in_progress()
    ).with_label(f"checks every {every} (the stream apply writes current)")


def streamed_freshness(table: TableConfig) -> dg.FreshnessPolicy:
    """No checked version for two periods and a run means the check cadence has stopped: the
    daemon is down, or its runs fail or never start (warn after one period and a run)."""
    period = timedelta(seconds=period_seconds(table.checks.every))
    return dg.FreshnessPolicy.time_window(fail_window=2 * period + RUN_ALLOWANCE, warn_window=period + RUN_ALLOWANCE)


def current_specs(table: TableConfig, lake_path: str, streamed: bool = False) -> list[dg.AssetSpec]:
    deps = [snapshot_asset_key(table), changelog_asset_key(table)]
    common: dict[str, Any] = {
        "group_name": group_name(table),
        "kinds": {"spark", "delta"},
        "deps": deps,
        "tags": {"cdc/source": table.source},
        "automation_condition": streamed_automation(table) if streamed else CURRENT_AUTOMATION,
        **({"freshness_policy": streamed_freshness(table)} if streamed else {}),
    }
    specs = [
        dg.AssetSpec(
            key=current_asset_key(table),
            description=(
                f"{table.key} as it is in the source: the latest committed generation, then every change after its "
                "watermark in source commit order, deletes applied, duplicates harmless. Incremental: each run "
                "applies only the changelog offsets recorded since the last one."
            ),
            metadata={"lake_path": f"{lake_path}/current"},
            **common,
        )
    ]
    if table.history:  # written by the same run from the same change batch: one position for both
        specs.append(
            dg.AssetSpec(
                key=history_asset_key(table),
                description=(
                    f"SCD type 2 history of {table.key}: one version per change with valid_from / valid_to (source "
                    "commit times) and is_current; never thrown away by a new generation."
                ),
                metadata={"lake_path": f"{lake_path}/history"},
                **common,
            )
        )
    return specs


def check_specs(table: TableConfig, streamed: bool = False) -> list[dg.AssetCheckSpec]:
    key = current_asset_key(table)
    fresh = dg.AssetCheckSpec(
        FRESH_CHECK,
        asset=key,
        description=(
            f"Current within {table.checks.fresh_within_s:.0f} s (checks.fresh_within_s) of the source (the "
            "newest change it holds), or caught up: evaluated by the stream apply with each report (every "
            "minute while it applies) and by the check run "
            f"(every {table.checks.every}) from the ledger and the topic's end offsets, so an apply that stopped "
            "fails it too."
        ),
    )
    return [
        *([fresh] if streamed else []),
        dg.AssetCheckSpec(
            SCHEMA_CHECK,
            asset=key,
            blocking=True,
            description=(
                f"The source schema against the registered schema history under {table.compatibility.value}; "
                "evaluated before anything is merged (an incompatible change merges nothing). Pandera schemas "
                "generated from the table's schema validate current (types, nullability, key columns)."
            ),
        ),
        dg.AssetCheckSpec(
            KEYS_CHECK,
            asset=key,
            blocking=True,
            description="Primary key non-null and unique in current.",
        ),
        dg.AssetCheckSpec(
            CHANGELOG_KEYS_CHECK,
            asset=key,
            description=(
                "In the changelog's recent records (since the committed generation), Kafka keys hold exactly the "
                "key columns and are the same text for every event of a row, and each Kafka record (partition, "
                "offset) is in the changelog once. Not blocking: current applies each record once by its position, "
                "so a finding here is the topic's or the changelog's, not current's."
            ),
        ),
        dg.AssetCheckSpec(
            COMPLETENESS_CHECK,
            asset=key,
            description=(
                "Changelog windows cover every offset since the watermark; dead letters per changelog partition "
                "(window or day) within the threshold; the topic is fed (the source's rows-written count moved only "
                "if the topic did); current equals one consistent source read row by row, except keys with changes "
                "in flight."
            ),
        ),
        *(history_check_specs(table) if table.history else []),
    ]


def history_check_specs(table: TableConfig) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            HISTORY_CHECK,
            asset=history_asset_key(table),
            description=(
                "Each key current holds has exactly one open version (is_current) in history, equal to it "
                "row by row, and no other key has one; keys with changes beyond the frontier both applied "
                "are left out."
            ),
        ),
        dg.AssetCheckSpec(
            HISTORY_CHAIN_CHECK,
            asset=history_asset_key(table),
            description=(
                "Each key's versions follow one another in the order of their source positions: none open "
                "before the last, none ending after the next begins, no two starting at one position (an "
                "event applied twice), each closed one with its end, and an update's version valid until "
                "the next one is valid from."
            ),
        ),
    ]


def build_current_asset(table: TableConfig, lake_path: str, streamed: bool = False) -> dg.AssetsDefinition:
    @dg.multi_asset(
        name=f"{table.source}__{table.dagster_name}__current",
        specs=current_specs(table, lake_path, streamed),
        check_specs=check_specs(table, streamed),
        retry_policy=RETRY_POLICY,
    )
    def current(
        context: dg.AssetExecutionContext,
        ledger: LedgerResource,
        sources: SourcesResource,
        kafka: KafkaResource,
        pyspark: CdcSparkResource,
    ) -> Iterator[Any]:
        step = CurrentStep(
            context, ledger.ledger(), sources.source(table.source), kafka, pyspark, ledger.table(table.key), streamed
        )
        with failures_mapped(f"current of {table.key}"):
            yield from step.run()

    return current


class CurrentStep:
    """Schema check, apply, then the keys and completeness checks on the result."""

    def __init__(
        self, context: dg.AssetExecutionContext, ledger: Ledger, source: Source, kafka: KafkaResource,
        pyspark: CdcSparkResource, table: LakeTable, streamed: bool = False,
    ) -> None:  # fmt: skip
        self.context, self.ledger, self.source, self.kafka, self.table = context, ledger, source, kafka, table
        self.streamed = streamed
        self.spark = pyspark.spark_session
        self.key = current_asset_key(table.config)

    def run(self) -> Iterator[Any]:
        committed = committed_generation(self.ledger, self.table)
        schema = self.schema_report(committed.generation)
        if not schema.compatible:
            assert schema.change is not None
            yield self._check(SCHEMA_CHECK, False, schema_check_metadata(schema), "; ".join(schema.change.problems))
            raise as_failure(
                SchemaIncompatibleError(
                    f"{self.table.key}: incompatible schema change under {schema.compatibility} "
                    f"({'; '.join(schema.change.problems)}). Nothing was merged. The rehydration sensor takes a new "
                    f"generation (reason schema_incompatible); or run: cdc-platform rehydrate {self.table.key}"
                )
            )
        # a streamed table: the source's stream apply is current's one writer; this run reports and checks
        result = (
            streamed_position(self.ledger, self.table)
            if self.streamed
            else apply_current(self.spark, self.ledger, self.table)
        )
        if result.waiting_for:
            self.context.log.warning(
                f"{self.table.key}: waiting for changelog windows: {'; '.join(result.waiting_for)}"
            )
        behind_by = self.offsets_behind(result) if self.streamed else None
        capture = CaptureWatch({self.table.source: self.source})(self.table.config) if self.streamed else None
        metadata = current_metadata(result, self.source.format_position, behind_by, capture)
        yield dg.MaterializeResult(asset_key=self.key, metadata=metadata)
        if result.history is not None:
            yield dg.MaterializeResult(
                asset_key=history_asset_key(self.table.config), metadata=history_metadata(result)
            )
        if self.streamed:  # the apply reports it each minute; a stopped apply reports nothing, so this run does too
            within_s = self.table.config.checks.fresh_within_s
            description = fresh_check_description(result, behind_by, within_s, self.table.source, capture=capture)
            metadata = fresh_check_metadata(result, behind_by, within_s, capture=capture)
            fresh = is_fresh(result, behind_by, within_s, capture=capture)
            yield self._check(FRESH_CHECK, fresh, metadata, description)
        yield from self.checks(schema, result, committed)

    def offsets_behind(self, result: CurrentResult) -> int:
        """Offsets of the table's topic beyond what current has applied (the ledger's frontier)."""
        return behind(result.frontier, self.kafka.clients().end_offsets(self.table.topic))

    def schema_report(self, generation: str) -> SchemaReport:
        """The source's schema against the registered history; when the source cannot be
        asked, the registered schema is used and the check says so (a warning)."""
        config = self.table.config
        try:
            _, observed = self.source.describe(config)
        except RetriableError as exc:
            return registered_report(self.ledger, config.key, config.compatibility, f"source not compared: {exc}")
        return evaluate_schema(self.ledger, config.key, config.compatibility, generation, observed)

    def checks(self, schema: SchemaReport, result: CurrentResult, committed: Any) -> Iterator[dg.AssetCheckResult]:
        frame = self.spark.read.format("delta").load(self.table.current_path)
        table_schema = TableSchema.from_json(committed.schema_json)
        keys = list(table_schema.key)
        nullable = {c.name: c.nullable for c in (schema.observed or table_schema).columns}
        schema.pandera_errors = pandera_errors(frame, nullable, keys)
        warn = schema.observed is None
        yield self._check(
            SCHEMA_CHECK, schema.passed and not warn, schema_check_metadata(schema), schema.note or None, warn
        )
        report = check_keys(frame, recent_changelog(self.spark, self.ledger, self.table), keys)
        yield self._check(
            KEYS_CHECK,
            report.current_passed,
            keys_check_metadata(report),
            keys_check_description(report, self.table.key),
        )
        yield self._check(
            CHANGELOG_KEYS_CHECK,
            report.changelog_passed,
            changelog_keys_check_metadata(report),
            changelog_keys_check_description(report, self.table.key),
        )
        inputs = CompletenessInputs(frame.drop(*POSITION_COLUMNS), committed)
        completeness = check_completeness(
            self.spark, self.ledger, self.source, self.kafka.clients(), self.table, inputs
        )
        # rows a polled source hard-deleted: a warning, fixed by the next reconciliation generation
        hard_deleted = completeness.passed and completeness.deleted_in_source > 0
        # rows not compared (capture not running, the in-flight span over its cap): current is
        # not verified, so a warning that says why, never a pass (keys alone pass a changed row)
        unverified = completeness.passed and not completeness.compared
        description = completeness.description(self.table.key, polled=not self.source.capabilities.sees_hard_deletes)
        if unverified:
            description = "; ".join(filter(None, [description, completeness.compare_note]))
        metadata = completeness_check_metadata(completeness, result.dropped_by_generation)
        warn = hard_deleted or unverified
        yield self._check(COMPLETENESS_CHECK, completeness.passed and not warn, metadata, description, warn)
        if self.table.config.history:
            yield self.history_check(table_schema)
            yield self.history_chain_check(table_schema)

    def history_check(self, schema: TableSchema) -> dg.AssetCheckResult:
        """History's open versions against current (``lake.compare.compare_history``)."""
        cap = self.table.config.completeness.max_in_flight_offsets
        comparison = compare_history(self.spark, self.ledger, self.kafka.clients(), self.table, schema, cap)
        passed, warn, description = history_check_outcome(comparison, self.table.key)
        metadata, history = history_check_metadata(comparison), history_asset_key(self.table.config)
        return self._check(HISTORY_CHECK, passed, metadata, description, warn, asset=history)

    def history_chain_check(self, schema: TableSchema) -> dg.AssetCheckResult:
        """History's versions against each other (``lake.compare.history_chain``)."""
        chain = history_chain(self.spark, self.table, list(schema.key))
        description = None
        if chain.faults:
            description = (
                f"history's versions do not follow one another ({chain_faults(chain)}; see sample_keys): history "
                "was written wrong or changed by hand. A generation never rewrites closed versions: find the commit "
                f"that did it in the Delta history of {self.table.history_path} and restore the table to the "
                f"version before it (RESTORE TABLE delta.`<path>` TO VERSION AS OF <n>), then cdc-platform rehydrate "
                f"{self.table.key}: the new generation corrects the open versions; the changes between the two stay "
                "in the changelog, not in history"
            )
        return self._check(
            HISTORY_CHAIN_CHECK,
            not chain.faults,
            chain_check_metadata(chain),
            description,
            asset=history_asset_key(self.table.config),
        )

    def _check(
        self, name: str, passed: bool, metadata: dict[str, Any], description: str | None = None, warn: bool = False,
        asset: dg.AssetKey | None = None,
    ) -> dg.AssetCheckResult:  # fmt: skip
        return dg.AssetCheckResult(
            asset_key=asset or self.key,
            check_name=name,
            passed=passed,
            severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR,
            metadata=metadata,
            description=description,
        )
