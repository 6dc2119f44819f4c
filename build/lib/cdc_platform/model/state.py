"""Pipeline state records kept in the ledger besides generations and windows (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True)
class CurrentPosition:
    """What current has applied: from which generation, up to which Kafka offsets (its
    frontier) and which source position."""

    generation: str
    frontier: dict[int, int]
    applied_position: int  # the newest source position applied (the watermark right after a rebuild)
    last_source_ts: datetime | None = None  # commit time of the newest change applied
    rows: int = 0
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class SchemaRecord:
    """One registered version of a table's schema."""

    version: int
    generation: str
    fingerprint: str
    schema_json: str  # TableSchema JSON: what the lake decodes with
    change: str  # 'baseline of generation …' or the change summary
    registered_at: datetime = field(default_factory=lambda: datetime.now(UTC))
