"""Changelog windows: their keys, when one is closed, and its offset ranges (pure).

A window is the table topic's records with timestamps in ``[start, end)``, as offset
ranges per Kafka partition, **fixed once**: the first time a window is materialized its
ranges are recorded in the ledger, and re-runs reuse them. A window starts exactly where
the recorded window before it ended, and ends where the recorded window after it starts;
edges with no recorded neighbour come from the first offset whose timestamp is at or
after the edge. So every offset belongs to exactly one window even when record
timestamps are not monotonic, and holes are checkable (``model.coverage``).

A window is **closed** — and only then materialized — when every partition has a record
at or after its end, or ``grace_s`` has passed since its end (an idle partition then
ends at its current end offset).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cdc_platform.model.coverage import Hole, OffsetRange, walk
from cdc_platform.model.errors import ChangelogGapError, WindowNotClosedError

KEY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # a window's key in the ledger (UTC, its start)
PARTITION_FORMAT = "%Y-%m-%dT%H:%M"  # its Dagster partition key
_SIZE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>[mhd])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}


def window_seconds(window: str) -> int:
    """``5m`` -> 300. Sizes divide a day, so windows align to UTC midnight (and the epoch)."""
    match = _SIZE.match(window)
    if not match:
        raise ValueError(f"'{window}' is not a window size (Nm, Nh or 1d)")
    return int(match["n"]) * _UNIT_S[match["unit"]]


def window_start(when: datetime, size_s: int) -> datetime:
    epoch = int(when.timestamp())
    return datetime.fromtimestamp(epoch - epoch % size_s, UTC)


def window_key(start: datetime) -> str:
    return start.astimezone(UTC).strftime(KEY_FORMAT)


def parse_window_key(key: str) -> datetime:
    return datetime.strptime(key, KEY_FORMAT).replace(tzinfo=UTC)


def partition_key(start: datetime) -> str:
    return start.astimezone(UTC).strftime(PARTITION_FORMAT)


BATCH_SEPARATOR = "#"  # a stream batch's key: "<day's window key>#<batch number>"
DAY_S = 86_400


def batch_key(day: str, batch: int) -> str:
    """The ledger key of a stream apply's micro-batch: its changelog partition (the UTC day
    it was planned in) and its number, zero-padded so keys sort in batch order."""
    return f"{day}{BATCH_SEPARATOR}{batch:012d}"


def changelog_partition(key: str) -> str:
    """The changelog's ``window_start`` partition a window or batch key writes to: a
    window's own key; a batch's day (bounded: one partition per table per day)."""
    return key.split(BATCH_SEPARATOR, 1)[0]


def is_batch_key(key: str) -> bool:
    return BATCH_SEPARATOR in key


@dataclass(frozen=True)
class WindowRange:
    """One Kafka partition's offsets in a window, and the key of the window after it."""

    partition: int
    start: int
    end: int
    window_end: str  # the next window's key: it starts exactly at ``end``

    @property
    def offsets(self) -> OffsetRange:
        return OffsetRange(self.partition, self.start, self.end)


@dataclass(frozen=True)
class PartitionFacts:
    """What Kafka says about one partition when a window is planned."""

    low: int  # the earliest offset still in Kafka
    high: int  # the end offset (next to be written)
    at_start: int | None = None  # first offset with a timestamp at or after the window start (None: none)
    at_end: int | None = None  # likewise for the window end


@dataclass(frozen=True)
class WindowPlan:
    key: str
    ranges: tuple[WindowRange, ...]
    reused: bool  # the ranges were recorded before (a re-run)


@dataclass(frozen=True)
class BatchPlan:
    """A stream apply's micro-batch of one table: planned (in the ledger) *before* its data
    is written, so a crash anywhere re-applies exactly these offsets under the same number
    (the Delta transaction version that makes its changelog append idempotent)."""

    number: int
    day: str  # the changelog partition it writes to (window key of its UTC day)
    ranges: tuple[OffsetRange, ...]

    @property
    def key(self) -> str:
        return batch_key(self.day, self.number)

    @property
    def offsets(self) -> int:
        return sum(r.size for r in self.ranges)

    def as_window(self, reused: bool) -> WindowPlan:
        """The batch as a recorded changelog range set (what coverage, current and checks read)."""
        ranges = tuple(WindowRange(r.partition, r.start, r.end, "") for r in self.ranges)
        return WindowPlan(self.key, ranges, reused)


def next_batch_due(idle_until: float | None, last_started: float | None, min_interval_s: float) -> float:
    """When a table's next micro-batch may start (monotonic seconds): after the pause of a
    table last found idle, and no sooner than ``min_interval_s`` after its previous batch
    started (Spark's processingTime trigger: a batch that took longer than the interval is
    followed at once, one that took less waits for the rest of it)."""
    due = idle_until or 0.0
    return due if last_started is None else max(due, last_started + min_interval_s)


def next_batch_ranges(
    table: str, frontier: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]], max_offsets: int
) -> tuple[OffsetRange, ...]:
    """The offsets a new micro-batch reads: per partition from the recorded frontier to the
    end of the topic, at most ``max_offsets`` in all (shared evenly, so no partition starves).
    Offsets Kafka no longer holds are a hole: the table must be rehydrated."""
    pending = {p: (frontier.get(p, 0), high) for p, (_, high) in watermarks.items() if high > frontier.get(p, 0)}
    for partition, (start, _) in sorted(pending.items()):
        low = watermarks[partition][0]
        if start < low:
            raise ChangelogGapError(
                f"{table}: partition {partition} must continue at offset {start}, but the earliest offset still in "
                f"Kafka is {low} (retention or DeleteRecords removed the rest): the changelog has a hole; the table "
                "must be rehydrated (new snapshot generation)"
            )
    share = max(1, max_offsets // max(1, len(pending)))
    return tuple(OffsetRange(p, start, min(high, start + share)) for p, (start, high) in sorted(pending.items()))


def neighbours(
    key: str, end_key: str, recorded: Mapping[str, Sequence[WindowRange]]
) -> tuple[dict[int, int], dict[int, int]]:
    """(recorded end of the window ending at ``key``, recorded start of the window at ``end_key``) per partition."""
    previous = {r.partition: r.end for ranges in recorded.values() for r in ranges if r.window_end == key}
    following = {r.partition: r.start for r in recorded.get(end_key, ())}
    return previous, following


def plan_window(
    table: str,
    start: datetime,
    end: datetime,
    recorded: Mapping[str, Sequence[WindowRange]],
    facts: Mapping[int, PartitionFacts],
    now: datetime,
    grace_s: float,
    floor: Mapping[int, int] | None = None,
) -> WindowPlan:
    """The window's ranges. ``floor`` is the latest generation's watermark offsets: offsets
    below it that Kafka no longer holds were needed only by older generations (no hole)."""
    key, end_key = window_key(start), window_key(end)
    if key in recorded:
        return WindowPlan(key, tuple(recorded[key]), reused=True)
    previous, following = neighbours(key, end_key, recorded)
    ranges = []
    for partition, fact in sorted(facts.items()):
        first = previous.get(partition, fact.at_start if fact.at_start is not None else fact.high)
        last = _window_end_offset(table, key, partition, end, fact, following, now, grace_s)
        first = _skip_rehydrated_hole(first, fact.low, (floor or {}).get(partition))
        if first < fact.low:
            raise ChangelogGapError(
                f"window {key} of {table}: partition {partition} must start at offset {first}, but the earliest "
                f"offset still in Kafka is {fact.low} (retention or DeleteRecords removed the rest): the changelog "
                "has a hole; the table must be rehydrated (new snapshot generation)"
            )
        ranges.append(WindowRange(partition, first, max(last, first), end_key))
    return WindowPlan(key, tuple(ranges), reused=False)


def _window_end_offset(
    table: str, key: str, partition: int, end: datetime, fact: PartitionFacts,
    following: Mapping[int, int], now: datetime, grace_s: float,
) -> int:  # fmt: skip
    if partition in following:
        return following[partition]
    if fact.at_end is not None:
        return fact.at_end  # a record at or after the window end exists: closed
    if now >= end + timedelta(seconds=grace_s):
        return fact.high  # an idle partition past the grace period
    raise WindowNotClosedError(
        f"window {key} of {table} is open: partition {partition} has no record at or after "
        f"{end.isoformat()} and the grace period ({grace_s:.0f} s) has not passed"
    )


def _skip_rehydrated_hole(first: int, low: int, floor: int | None) -> int:
    if first < low and floor is not None and floor >= low:
        return max(first, floor)  # a newer generation was taken past the hole
    return first


def is_closed(end: datetime, now: datetime, grace_s: float, every_partition_past_end: bool) -> bool:
    """A window may be materialized: it is over, and either every partition has a record
    at or after its end or the grace period has passed."""
    if end > now:
        return False
    return now >= end + timedelta(seconds=grace_s) or every_partition_past_end


def due_windows(
    first: datetime, size_s: int, recorded: set[str], busy: set[str], now: datetime
) -> Iterator[tuple[datetime, datetime]]:
    """Windows from the one starting at ``first`` whose end has passed, that are neither
    recorded (``recorded``: ledger keys) nor being materialized (``busy``: partition keys),
    in order."""
    step = timedelta(seconds=size_s)
    start = first
    while start + step <= now:
        if window_key(start) not in recorded and partition_key(start) not in busy:
            yield start, start + step
        start += step


def partition_coverage(
    batches: Mapping[str, Sequence[OffsetRange]], partition: str
) -> tuple[dict[int, tuple[int, int]], tuple[Hole, ...]]:
    """A streamed changelog partition's offsets per Kafka partition (first, end) and the
    holes inside them: offsets between its batches' first and last that no batch of the
    table holds. Batches of other partitions count: a table whose partitioning changed
    (hours back to days within a day) has a day partition whose key is its first hour's,
    with the hours between in partitions of their own; those offsets are in the changelog,
    once, not missing. ``batches``: every batch key of the table and its ranges."""
    own = [r for key, ranges in batches.items() if changelog_partition(key) == partition for r in ranges]
    others = [r for key, ranges in batches.items() if changelog_partition(key) != partition for r in ranges]
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for r in own:
        starts[r.partition] = min(starts.get(r.partition, r.start), r.start)
        ends[r.partition] = max(ends.get(r.partition, r.end), r.end)
    coverage = walk(starts, [*own, *(r for r in others if r.partition in starts)])
    holes = tuple(h for h in coverage.holes if h.start < ends[h.partition])
    return {p: (s, ends[p]) for p, s in sorted(starts.items())}, holes
