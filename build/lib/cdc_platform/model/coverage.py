"""Which Kafka offsets the changelog covers: the one coverage walk (pure).

A changelog is a set of recorded offset ranges ``[start, end)`` per Kafka partition.
Starting at a generation's watermark (the topic's end offsets when the generation was
taken), the walk moves each partition's *frontier* across contiguous ranges and notes
every *hole* (offsets after the frontier that no range covers, before a range that
does). Current applies up to the frontier; the completeness check reports the holes;
the rehydration sensor asks Kafka to still hold the frontier (the next offset needed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one Kafka partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Hole:
    partition: int
    start: int
    end: int  # exclusive: the start of the next recorded range

    def describe(self) -> str:
        return f"partition {self.partition}: offsets {self.start}..{self.end - 1} in no window"


@dataclass(frozen=True)
class Coverage:
    frontier: dict[int, int]  # per partition: every offset below it is covered contiguously
    holes: tuple[Hole, ...] = field(default=())

    @property
    def offsets_missing(self) -> int:
        return sum(h.end - h.start for h in self.holes)


def walk(start: Mapping[int, int], ranges: Iterable[OffsetRange]) -> Coverage:
    """Frontier and holes per partition, from ``start`` across ``ranges`` (any order,
    overlaps and duplicates allowed). Partitions absent from ``start`` start at 0."""
    by_partition: dict[int, list[OffsetRange]] = {}
    for r in ranges:
        by_partition.setdefault(r.partition, []).append(r)
    frontier = dict(start)
    holes: list[Hole] = []
    for partition, spans in sorted(by_partition.items()):
        position = reach = frontier.get(partition, 0)
        for r in sorted(spans):
            if r.end <= position:
                continue  # already covered (an overlap or a duplicate record)
            if r.start > position:
                holes.append(Hole(partition, position, r.start))
            elif reach == position:
                reach = r.end  # still contiguous from the start
            position = r.end
        frontier[partition] = reach
    return Coverage(frontier, tuple(holes))


def holes_not_restarted(holes: Iterable[Hole], restarts: Iterable[Mapping[int, int]]) -> tuple[Hole, ...]:
    """The holes of a day's batches that no committed generation explains. A generation
    committed during the day restarts the stream at its watermark offsets: the offsets
    between the last batch before it and its watermark are in its snapshot, never in a
    batch. A hole that ends exactly at a committed generation's watermark offset of its
    partition is that restart; any other is a real hole."""
    points = {(p, offset) for marks in restarts for p, offset in marks.items()}
    return tuple(h for h in holes if (h.partition, h.end) not in points)


def behind(frontier: Mapping[int, int], ends: Mapping[int, int]) -> int:
    """Offsets in Kafka (up to ``ends``) that are not below the frontier."""
    return sum(max(0, end - frontier.get(p, 0)) for p, end in ends.items())


def in_flight_ranges(
    frontier: Mapping[int, int], read_from: Mapping[int, int], ends: Mapping[int, int]
) -> list[tuple[int, int, int]]:
    """The offsets whose keys an exact comparison of current with a source read must leave
    out: ``[partition, start, end)`` from the lower of current's frontier and the Kafka
    offsets taken just before the source read (``read_from``), to ``ends`` (taken once
    the producer confirmed a position after the read). Below the start every event is
    both applied to current and older than the read; at or after ``ends`` none is older
    than the read. A key with no event in between must be equal on both sides."""
    spans = []
    for partition, end in sorted(ends.items()):
        start = min(frontier.get(partition, 0), read_from.get(partition, 0))
        top = max(end, frontier.get(partition, 0))
        if top > start:
            spans.append((partition, start, top))
    return spans


def lost_offsets(needed: Mapping[int, int], earliest: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """Partitions whose next needed offset Kafka no longer holds: partition -> (needed, earliest)."""
    return {p: (needed[p], low) for p, low in earliest.items() if p in needed and low > needed[p]}
