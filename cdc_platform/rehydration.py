"""When a table needs a new snapshot generation, and why (pure: facts in, decisions out).

The rehydration sensor gathers the facts (Dagster's records, Kafka offsets, the slot, the
signal table) and asks these functions. Each need carries a *cause*: the same cause never
starts two generations (the sensor remembers causes it acted on, per table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    BOOTSTRAP = "bootstrap"  # no generation yet
    CHANGELOG_GAP = "changelog_gap"  # Kafka no longer has offsets the changelog needs
    SOURCE_POSITION_LOST = "source_position_lost"  # the replication slot was dropped or invalidated
    SCHEMA_INCOMPATIBLE = "schema_incompatible"  # the schema check failed under the table's mode
    CURRENT_MISSING = "current_missing"  # the current table is gone or unreadable
    CHECKS_FAILED = "checks_failed"  # keys or completeness failed on current
    MANUAL = "manual"  # a person asked (CLI, launchpad, signal table)
    RECONCILIATION = "reconciliation"  # a polled table's periodic generation (drops hard-deleted rows)


@dataclass(frozen=True)
class Need:
    table: str
    reason: Reason
    detail: str
    cause: str  # identity of the cause: acted on once

    def tags(self) -> dict[str, str]:
        return {"cdc/reason": self.reason.value, "cdc/table": self.table, "cdc/cause": self.cause[:200]}


def next_needed_offsets(watermark: dict[int, int], ranges: Iterable[tuple[int, int, int]]) -> dict[int, int]:
    """Per Kafka partition, the first offset at or after the watermark that no recorded
    window range (partition, start, end) covers contiguously: what Kafka must still hold."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for partition, start, end in ranges:
        by_partition.setdefault(partition, []).append((start, end))
    needed = dict(watermark)
    for partition, spans in by_partition.items():
        position = needed.get(partition, 0)
        for start, end in sorted(spans):
            if start <= position < end:
                position = end
        needed[partition] = position
    return needed


def changelog_gap(table: str, generation: str, needed: dict[int, int], earliest: dict[int, int]) -> Need | None:
    lost = {p: (needed[p], low) for p, low in earliest.items() if p in needed and low > needed[p]}
    if not lost:
        return None
    detail = "; ".join(f"partition {p}: needs offset {n}, Kafka starts at {lo}" for p, (n, lo) in sorted(lost.items()))
    return Need(
        table, Reason.CHANGELOG_GAP, f"retention or DeleteRecords removed offsets: {detail}", f"gap:{generation}"
    )


def slot_lost(slot: str, exists: bool, wal_status: str | None, remembered_slot: str | None) -> str | None:
    """Why the source position is lost, or None. A slot that never existed (capture has not
    run yet) is not lost; one the heartbeat topic remembers, and that is gone, is."""
    if exists and wal_status == "lost":
        return f"replication slot {slot} is invalidated (wal_status=lost)"
    if not exists and remembered_slot == slot:
        return f"replication slot {slot} no longer exists (capture had confirmed changes with it)"
    return None


def signal_tables(signal_type: str, data: str | None, source: str, schema_tables: dict[str, str]) -> list[str]:
    """Tables (config keys) a signal row asks to rehydrate. Accepts Debezium's
    ``execute-snapshot`` (data ``{"data-collections": ["public.orders"]}``) and the
    platform's ``rehydrate`` (data: ``public.orders`` or ``shop.public.orders``, or a JSON
    list of them). ``schema_tables`` maps ``schema.table`` to config keys of this source."""
    if signal_type not in ("execute-snapshot", "rehydrate"):
        return []
    names: list[str] = []
    text = (data or "").strip()
    try:
        parsed = json.loads(text) if text.startswith(("{", "[", '"')) else text
    except json.JSONDecodeError:
        return []
    if isinstance(parsed, dict):
        parsed = parsed.get("data-collections", [])
    for raw in [parsed] if isinstance(parsed, str) else parsed if isinstance(parsed, list) else []:
        name = str(raw).strip()
        name = name[len(source) + 1 :] if name.startswith(f"{source}.") else name
        if name in schema_tables:
            names.append(schema_tables[name])
    return names


def reconciliation_due(
    table: str, generation: str, generation_at: float | None, every_s: float | None, now: float
) -> Need | None:
    """A polled table's generation is older than ``poll.reconcile_every``: polling cannot see
    hard deletes, so a new generation is the only way to drop rows the source deleted."""
    if every_s is None or generation_at is None or now - generation_at < every_s:
        return None
    age_min = (now - generation_at) / 60
    return Need(
        table,
        Reason.RECONCILIATION,
        f"generation {generation} is {age_min:.0f} min old (reconcile_every {every_s / 60:.0f} min): polling "
        "cannot see hard deletes, a new generation drops rows the source no longer has",
        f"reconcile:{generation}",
    )
