"""A table's registered schema versions (in the ledger) and the compatibility verdict on
an observed source schema (``model.schemas`` holds the rules).

Each generation registers its schema as a new baseline; a compatible change observed
later is registered as the next version and flows through (the changelog decodes with
it, current and history gain the column); an incompatible one is reported and not
registered, so nothing is applied with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_platform.config.model import CompatibilityMode, TableConfig
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.schemas import SchemaChange, compare
from cdc_platform.model.state import SchemaRecord
from cdc_platform.model.tables import TableSchema
from cdc_platform.sources.base import Source


@dataclass
class SchemaReport:
    version: int
    registered: bool  # a new version was registered by this evaluation
    change: SchemaChange | None
    compatibility: str
    observed: TableSchema | None = None  # the source schema compared (None: the source was not reachable)
    pandera_errors: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def compatible(self) -> bool:
        return self.change is None or self.change.compatible

    @property
    def passed(self) -> bool:
        return self.compatible and not self.pandera_errors


def evaluate_schema(
    ledger: Ledger, table: str, mode: CompatibilityMode, generation: str, observed: TableSchema
) -> SchemaReport:
    """Compare the source's schema with the registered history; register it if it is new
    and compatible under ``mode``."""
    history = ledger.schema_history(table)
    fingerprint = observed.version().fingerprint()
    if not history:
        ledger.register_schema(
            table, SchemaRecord(1, generation, fingerprint, observed.to_json(), f"baseline of generation {generation}")
        )
        return SchemaReport(1, True, None, mode.value, observed)
    latest = history[-1]
    if latest.fingerprint == fingerprint:
        return SchemaReport(latest.version, False, None, mode.value, observed)
    change = compare(TableSchema.from_json(latest.schema_json).version(), observed.version(), mode)
    if not change.compatible:
        return SchemaReport(latest.version, False, change, mode.value, observed)
    version = latest.version + 1
    ledger.register_schema(table, SchemaRecord(version, generation, fingerprint, observed.to_json(), change.summary()))
    return SchemaReport(version, True, change, mode.value, observed)


def registered_report(ledger: Ledger, table: str, mode: CompatibilityMode, note: str) -> SchemaReport:
    """The verdict when the source cannot be asked: the registered schema, compared with nothing."""
    history = ledger.schema_history(table)
    version = history[-1].version if history else 0
    return SchemaReport(version, False, None, mode.value, None, note=note)


def schema_refresh(ledger: Ledger, source: Source, table: TableConfig) -> Callable[[set[str]], TableSchema | None]:
    """What the changelog calls when records carry columns the registered schema lacks:
    ask the source, register the change if it is compatible (the refreshed schema), else None."""

    def refresh(_unknown: set[str]) -> TableSchema | None:
        _, observed = source.describe(table)
        committed = ledger.committed(table.key)
        report = evaluate_schema(
            ledger, table.key, table.compatibility, committed.generation if committed else "", observed
        )
        return observed if report.compatible else None

    return refresh
