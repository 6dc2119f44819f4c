"""The lake's core functions bound to one config, for tests, benchmarks and dev tools that call
them directly: the same calls the Dagster assets make (``orchestration/assets``), without Dagster."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from cdc_platform.config import PlatformConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import WindowResult, materialize_window
from cdc_platform.lake.checks import CompletenessInputs, CompletenessReport, check_completeness
from cdc_platform.lake.current import CurrentResult, apply_current
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.schema_registry import schema_refresh
from cdc_platform.lake.snapshot import GenerationRequest, SnapshotResult, read_plan, take_generation, wave_history
from cdc_platform.lake.tables import LakeTable, lake_table, table_options
from cdc_platform.sources import Source, open_source

T = TypeVar("T")


class Lake:
    def __init__(self, config: PlatformConfig, spark: Any) -> None:
        self.config, self.spark = config, spark
        self.kafka = KafkaClients(config.kafka)
        self.ledger = Ledger(config.lake.root)
        self._sources: dict[str, Source] = {}

    def table(self, key: str) -> LakeTable:
        return lake_table(self.config, self.config.table(key))

    def source(self, key: str) -> Source:
        name = self.config.table(key).source
        if name not in self._sources:
            self._sources[name] = open_source(self.config, name, self.kafka)
        return self._sources[name]

    def wave_commits(self, key: str, generation: str) -> list[int]:
        """The wave numbers of a chunked generation's snapshot-table commits, oldest first."""
        history = wave_history(self.spark, self.table(key).snapshot_path(generation))
        return [wave for _, _, wave in history if wave is not None]

    def snapshot(self, key: str, generation: str, reason: str = "test") -> SnapshotResult:
        request = GenerationRequest(generation, reason=reason, cause=f"test:{generation}")
        return take_generation(
            self.spark, self.ledger, self.source(key), self.kafka, self.table(key), request, lambda _m: None
        )

    def window(self, key: str, start: datetime, end: datetime) -> WindowResult:
        refresh = schema_refresh(self.ledger, self.source(key), self.config.table(key))
        return materialize_window(self.spark, self.ledger, self.kafka, self.table(key), start, end, refresh)

    def current(self, key: str) -> CurrentResult:
        return apply_current(self.spark, self.ledger, self.table(key))

    def truth(self, key: str) -> Any:
        """A consistent read of the source as the lake would hold it (not a generation)."""
        import uuid

        path = f"{self.config.lake.root}/_truth/{uuid.uuid4().hex[:8]}"
        self._read_source(
            key, lambda frame: frame.write.format("delta").options(**table_options(frame.schema)).save(path)
        )
        return self.spark.read.format("delta").load(path)

    def truth_rows(self, key: str) -> list[Any]:
        """``truth`` collected, without writing it to a Delta table first (tests' small tables)."""
        return list(self._read_source(key, lambda frame: frame.collect()))

    def _read_source(self, key: str, use: Callable[[Any], T]) -> T:
        """``use`` of the source's rows as the lake would hold them, read at one instant."""
        table = self.table(key)
        with self.source(key).snapshot(table.config, self.kafka, table.topic) as plan:
            return use(read_plan(self.spark, plan))

    def replace_current(self, key: str, change: Callable[[Any], Any]) -> None:
        """Overwrite current with ``change(current)`` (position columns included), as a
        bug in the apply would leave it: for tests that a check or verify finds it."""
        path = self.table(key).current_path
        changed = change(self.spark.read.format("delta").load(path)).localCheckpoint()
        changed.write.format("delta").mode("overwrite").save(path)

    def read_current(self, key: str) -> Any:
        from cdc_platform.lake.current import POSITION_COLUMNS

        return self.spark.read.format("delta").load(self.table(key).current_path).drop(*POSITION_COLUMNS)

    def completeness(self, key: str) -> CompletenessReport:
        """The completeness check as the current asset runs it, on current as it is now."""
        committed = self.ledger.committed(key)
        assert committed is not None, f"{key} has no committed generation"
        inputs = CompletenessInputs(self.read_current(key), committed)
        return check_completeness(self.spark, self.ledger, self.source(key), self.kafka, self.table(key), inputs)
