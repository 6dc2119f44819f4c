"""Snapshot generations: their status, their order, and which one the lake uses (pure).

A generation is one snapshot of a table (the bootstrap, then each rehydration). Its life,
as the ledger records it: ``requested`` (a sensor or a person asked), ``running`` (its
run started reading), then ``committed`` (written *and* validated) or ``failed``. The
lake only ever uses a committed generation, and among those the one taken last: order is
the time its watermark was taken, never its name (names come from anywhere: the sensor,
the CLI, the launchpad).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class GenerationStatus(StrEnum):
    REQUESTED = "requested"
    RUNNING = "running"
    COMMITTED = "committed"
    FAILED = "failed"


FINISHED = (GenerationStatus.COMMITTED, GenerationStatus.FAILED)


@dataclass(frozen=True)
class Watermark:
    """Where the source and Kafka stood just before the snapshot read began: every change
    after ``position`` is in the changelog from ``kafka_end_offsets`` on."""

    position: int  # source position: an LSN, or a polled source's database clock (ns)
    kafka_end_offsets: dict[int, int]  # Kafka partition -> next offset to be written
    taken_at: datetime

    def to_json(self) -> str:
        return json.dumps(
            {
                "position": self.position,
                "kafka_end_offsets": {str(p): o for p, o in self.kafka_end_offsets.items()},
                "taken_at": self.taken_at.isoformat(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Watermark:
        data: dict[str, Any] = json.loads(text)
        return cls(
            int(data["position"]),
            {int(p): int(o) for p, o in data["kafka_end_offsets"].items()},
            datetime.fromisoformat(data["taken_at"]),
        )


@dataclass(frozen=True)
class GenerationEvent:
    """One step in a generation's life, as appended to the ledger."""

    table: str
    generation: str
    status: GenerationStatus
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    reason: str = ""
    cause: str = ""  # identity of what asked for it (one cause starts one generation)
    covers: tuple[str, ...] = ()  # further causes it answers (signal rows asking for the same table)
    run_id: str = ""
    watermark: Watermark | None = None
    rows: int | None = None
    schema_json: str = ""  # the table's resolved schema at the snapshot (TableSchema JSON)
    detail: str = ""  # why it failed, with the fix


@dataclass(frozen=True)
class Generation:
    """A generation as it stands now: its latest event, and when it was first seen."""

    table: str
    generation: str
    status: GenerationStatus
    requested_at: datetime
    updated_at: datetime
    reason: str = ""
    cause: str = ""
    covers: tuple[str, ...] = ()
    run_id: str = ""
    watermark: Watermark | None = None
    rows: int | None = None
    schema_json: str = ""
    detail: str = ""
    failures: int = 0  # runs of it that failed (a resumed generation can fail more than once)

    @property
    def order(self) -> tuple[datetime, datetime, str]:
        """Taken order: the watermark's time once taken, else when first seen."""
        taken = self.watermark.taken_at if self.watermark else self.requested_at
        return (taken, self.requested_at, self.generation)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def fold(events: Iterable[GenerationEvent]) -> dict[str, Generation]:
    """Generations by name from their events (any order; later events win). A finished
    generation never goes back to running, but for a failed one that a new run resumes
    (its 'running' event names another run than the one that failed it): a late event of
    the failed run (a retried step) does not reopen it, a resume does."""
    out: dict[str, Generation] = {}
    for event in sorted(events, key=lambda e: e.at):
        known = out.get(event.generation)
        if known is None:
            out[event.generation] = Generation(
                event.table, event.generation, event.status, event.at, event.at, event.reason, event.cause,
                event.covers, event.run_id, event.watermark, event.rows, event.schema_json, event.detail,
                failures=int(event.status is GenerationStatus.FAILED),
            )  # fmt: skip
            continue
        if known.finished and event.status not in FINISHED and not _resumes(known, event):
            continue  # a late 'running' (a retried step) does not reopen a finished generation
        out[event.generation] = replace(
            known,
            status=event.status,
            failures=known.failures + int(event.status is GenerationStatus.FAILED),
            updated_at=event.at,
            reason=event.reason or known.reason,
            cause=event.cause or known.cause,
            covers=event.covers or known.covers,
            run_id=event.run_id or known.run_id,
            watermark=event.watermark or known.watermark,
            rows=event.rows if event.rows is not None else known.rows,
            schema_json=event.schema_json or known.schema_json,
            detail=event.detail or known.detail,
        )
    return out


def latest_committed(generations: Iterable[Generation]) -> Generation | None:
    """The generation the lake uses: the last-taken committed one."""
    committed = [g for g in generations if g.status is GenerationStatus.COMMITTED]
    return max(committed, key=lambda g: g.order) if committed else None


def _resumes(known: Generation, event: GenerationEvent) -> bool:
    """A new run of a failed generation started (``cdc-platform snapshot --resume``, the
    sensor resuming it, or its run re-executed in the UI)."""
    return (
        known.status is GenerationStatus.FAILED
        and event.status is GenerationStatus.RUNNING
        and bool(event.run_id)
        and event.run_id != known.run_id
    )


def unfinished(generations: Iterable[Generation]) -> list[Generation]:
    return sorted((g for g in generations if not g.finished), key=lambda g: g.order)


@dataclass(frozen=True)
class RunState:
    """What Dagster's run storage says about a generation's run."""

    alive: bool  # queued, starting or running
    finished_unsuccessfully: bool = False


def in_flight(
    generations: Iterable[Generation],
    runs: Mapping[str, RunState],
    queued_runs: int,
    now: datetime,
    request_grace_s: float = 600.0,
) -> Generation | None:
    """The generation still on its way, if any. ``runs`` maps run ids to their state;
    ``queued_runs`` counts generation runs of the table not yet started. A running
    generation whose run is gone (failed, canceled, killed) is not in flight; a requested
    one is, while a run for it is queued or for ``request_grace_s`` after the request."""
    for generation in unfinished(generations):
        state = runs.get(generation.run_id) if generation.run_id else None
        if state is not None:
            if state.alive:
                return generation
            continue  # its run ended without committing or failing it: dead
        if generation.status is GenerationStatus.REQUESTED:
            waited = (now - generation.requested_at).total_seconds()
            if queued_runs or waited < request_grace_s:
                return generation
    return None
