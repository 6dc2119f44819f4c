"""When a table needs a new snapshot generation, and why (pure: facts in, decisions out).

The rehydration sensor gathers the facts (the ledger, Kafka's offsets, the source's
position and signal table, Dagster's check results and run states) and asks ``needs``
what the table needs and ``choose`` which need to act on now. Each need carries a
*cause*; a cause is recorded with the generation it starts, so it never starts two:
while that generation is in flight nothing else starts, once it committed the cause is
done, and if it failed the same cause is tried again after a growing pause.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from cdc_platform.model.coverage import lost_offsets
from cdc_platform.model.generations import Generation, GenerationStatus

RETRY_FIRST_S = 60.0
RETRY_MAX_S = 3600.0


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
    covers: tuple[str, ...] = ()  # further causes the same generation answers

    def tags(self) -> dict[str, str]:
        return {"cdc/reason": self.reason.value, "cdc/table": self.table, "cdc/cause": self.cause[:200]}


@dataclass(frozen=True)
class FailedCheck:
    check: str
    evaluation: str  # identity of the failing evaluation (its run id)
    description: str


# what a failed keys or completeness check counted that a new generation repairs: current's
# keys and rows (null, duplicate, missing, extra, differing) and offsets the changelog misses
REPAIRED_BY_A_GENERATION = ("mismatches", "offsets_missing")


def repaired_by_a_generation(counts: Mapping[str, object]) -> bool:
    """Whether a failed check's findings (its numeric metadata) are a generation's to repair.
    A generation rebuilds current from the source; it cannot take a record out of the
    changelog, a dead letter out of its table, or a second copy of a key out of the source,
    so a check failing only on those fails the same after it. As each evaluation is a new
    cause, one generation per evaluation followed, every 10 minutes on a streamed table.
    An evaluation without the counts (an older one) is taken as repairable, as before."""
    known = [counts[name] for name in REPAIRED_BY_A_GENERATION if name in counts]
    return not known or any(isinstance(n, int | float) and n > 0 for n in known)


@dataclass(frozen=True)
class TableFacts:
    """Everything the decision needs about one table, gathered by the sensor."""

    table: str
    generations: Sequence[Generation]
    committed: Generation | None
    needed_offsets: Mapping[int, int] = field(default_factory=dict)  # the coverage frontier since the watermark
    kafka_earliest: Mapping[int, int] = field(default_factory=dict)
    position_lost: str | None = None
    signals: Sequence[str] = ()  # causes of signal rows naming this table ("signal:<source>:<id>")
    current_built: bool = False  # current was built from the committed generation
    current_exists: bool = True
    failed_checks: Sequence[FailedCheck] = ()  # evaluated after the committed generation
    reconcile_every_s: float | None = None


def needs(facts: TableFacts, now: datetime) -> list[Need]:
    """What the table needs, most urgent first."""
    out = []
    if facts.signals:  # one generation answers every signal row waiting for the table
        count = len(facts.signals)
        detail = f"asked for in the signal table ({count} row{'s' if count > 1 else ''})"
        out.append(Need(facts.table, Reason.MANUAL, detail, facts.signals[0], tuple(facts.signals[1:])))
    committed = facts.committed
    if committed is None:
        return [Need(facts.table, Reason.BOOTSTRAP, "no committed snapshot generation yet", "bootstrap"), *out]
    g = committed.generation
    if facts.position_lost:
        out.append(Need(facts.table, Reason.SOURCE_POSITION_LOST, facts.position_lost, f"position_lost:{g}"))
    gap = changelog_gap(facts.table, g, facts.needed_offsets, facts.kafka_earliest)
    if gap is not None:
        out.append(gap)
    if facts.current_built and not facts.current_exists:
        out.append(Need(facts.table, Reason.CURRENT_MISSING, "current's Delta table is gone", f"current:{g}"))
    for failed in facts.failed_checks:
        reason = Reason.SCHEMA_INCOMPATIBLE if failed.check == "schema_compatible" else Reason.CHECKS_FAILED
        detail = failed.description if reason is Reason.SCHEMA_INCOMPATIBLE else f"{failed.check}: {failed.description}"
        out.append(Need(facts.table, reason, detail, f"{failed.check}:{failed.evaluation}"))
    due = reconciliation_due(facts.table, committed, facts.reconcile_every_s, now)
    if due is not None:
        out.append(due)
    return out


@dataclass(frozen=True)
class Decision:
    need: Need | None  # act on this one now
    waiting: str = ""  # why nothing is started (for the sensor's skip reason)
    attempt: int = 1  # how many generations this cause has started, this one included


def choose(
    candidates: Sequence[Need], generations: Iterable[Generation], in_flight: Generation | None, now: datetime
) -> Decision:
    """The first need whose cause is not done, not in flight and not pausing after a failure."""
    if in_flight is not None:
        return Decision(None, f"generation {in_flight.generation} in flight ({in_flight.status.value})")
    by_cause: dict[str, list[Generation]] = {}
    for generation in generations:
        if generation.cause:
            by_cause.setdefault(generation.cause, []).append(generation)
    waiting = []
    for need in candidates:
        started = by_cause.get(need.cause, [])
        if any(g.status is GenerationStatus.COMMITTED for g in started):
            continue  # done: that generation was the remedy
        retry_at = next_attempt_at(started)
        if retry_at is not None and retry_at > now:
            waiting.append(f"{need.reason.value} retries at {retry_at.isoformat(timespec='seconds')}")
            continue
        return Decision(need, attempt=len(started) + 1)
    return Decision(None, "; ".join(waiting))


def interrupted_generation(cause: str, generations: Iterable[Generation]) -> Generation | None:
    """The cause's last generation, if it did not commit: its run failed or died (a cause
    with a generation in flight is never acted on). A chunked one is resumed rather than
    replaced: it reads only the chunks it had not written."""
    mine = [g for g in generations if g.cause == cause]
    last = max(mine, key=lambda g: g.order) if mine else None
    return last if last is not None and last.status is not GenerationStatus.COMMITTED else None


def pending_signals(signal_causes: Sequence[str], generations: Iterable[Generation]) -> list[str]:
    """Signal rows no generation answered yet (each generation records the causes it answers)."""
    answered = {cause for g in generations for cause in (g.cause, *g.covers)}
    return [cause for cause in dict.fromkeys(signal_causes) if cause not in answered]


def next_attempt_at(failed: Sequence[Generation]) -> datetime | None:
    """After n failed runs of one cause's generations, the next may start 60 s·2^(n-1) (at
    most an hour) after the last failure: a cause that keeps failing does not start a
    generation on every tick, and one that was fixed is retried soon."""
    if not failed:
        return None
    failures = sum(max(1, g.failures) for g in failed)  # a resumed generation counts each failed run
    pause = min(RETRY_FIRST_S * 2 ** (failures - 1), RETRY_MAX_S)
    return max(g.updated_at for g in failed) + timedelta(seconds=pause)


def changelog_gap(table: str, generation: str, needed: Mapping[int, int], earliest: Mapping[int, int]) -> Need | None:
    lost = lost_offsets(needed, earliest)
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


def signal_tables(signal_type: str, data: str | None, source: str, schema_tables: Mapping[str, str]) -> list[str]:
    """Tables (config keys) a signal row asks to rehydrate. Accepts Debezium's
    ``execute-snapshot`` (data ``{"data-collections": ["public.orders"]}``) and the
    platform's ``rehydrate`` (data: ``public.orders`` or ``shop.public.orders``, or a JSON
    list of them). ``schema_tables`` maps ``schema.table`` to config keys of this source."""
    if signal_type not in ("execute-snapshot", "rehydrate"):
        return []
    text = (data or "").strip()
    try:
        parsed = json.loads(text) if text.startswith(("{", "[", '"')) else text
    except json.JSONDecodeError:
        return []
    if isinstance(parsed, dict):
        parsed = parsed.get("data-collections", [])
    names: list[str] = []
    for raw in [parsed] if isinstance(parsed, str) else parsed if isinstance(parsed, list) else []:
        name = str(raw).strip()
        name = name[len(source) + 1 :] if name.startswith(f"{source}.") else name
        if name in schema_tables:
            names.append(schema_tables[name])
    return names


# how long past due a reconciliation may be before ``unseen_deletes`` calls it missing: the
# rehydration sensor's interval, plus the time a generation of a big table takes
RECONCILIATION_GRACE_S = 900.0


def unseen_deletes(committed: Generation, every_s: float | None, now: datetime, rows: int) -> tuple[bool, str]:
    """``rows`` rows current holds that a polled source no longer has: the hard deletes the
    next reconciliation generation drops (True, and when), or, when none is configured
    or it is overdue, a difference to report (False, and the fix)."""
    what = f"{rows} row(s) in current are no longer in the source (hard deletes, which polling cannot see)"
    if every_s is None:
        return False, f"{what}, and no poll.reconcile_every drops them: set it (e.g. 6h), or run cdc-platform rehydrate"
    due = committed.updated_at + timedelta(seconds=every_s)
    if now > due + timedelta(seconds=RECONCILIATION_GRACE_S):
        return False, (
            f"{what}; the reconciliation generation was due at {due:%Y-%m-%d %H:%M} UTC and has not been taken: "
            "is the daemon's rehydration sensor running?"
        )
    return True, f"{what}; the reconciliation generation due by {due:%Y-%m-%d %H:%M} UTC drops them"


def reconciliation_due(table: str, committed: Generation, every_s: float | None, now: datetime) -> Need | None:
    """A polled table's generation is older than ``poll.reconcile_every``: polling cannot see
    hard deletes, so a new generation is the only way to drop rows the source deleted."""
    if every_s is None:
        return None
    age_s = (now - committed.updated_at).total_seconds()
    if age_s < every_s:
        return None
    return Need(
        table,
        Reason.RECONCILIATION,
        f"generation {committed.generation} is {age_s / 60:.0f} min old (reconcile_every {every_s / 60:.0f} min): "
        "polling cannot see hard deletes, a new generation drops rows the source no longer has",
        f"reconcile:{committed.generation}",
    )
