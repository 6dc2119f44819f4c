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
    # commit time of the newest change applied; after a rebuild, the generation's watermark time
    last_source_ts: datetime | None = None
    rows: int = 0
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # the newest truncate applied since the generation, (commit position, LSN): an event at
    # or before it is older than the truncate, which removed its row, so a re-sent one must
    # not bring the row back (a delete is remembered per key; a truncate, of every key, here)
    truncated_at: tuple[int, int] | None = None


@dataclass(frozen=True)
class SchemaRecord:
    """One registered version of a table's schema."""

    version: int
    generation: str
    fingerprint: str
    schema_json: str  # TableSchema JSON: what the lake decodes with
    change: str  # 'baseline of generation …' or the change summary
    registered_at: datetime = field(default_factory=lambda: datetime.now(UTC))
