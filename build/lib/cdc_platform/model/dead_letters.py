"""Dead letters a person has examined: what the completeness check stops counting.

A dead letter is a Kafka record the changelog could not decode (``errors.tolerance:
all``), kept with its raw bytes. The completeness check fails while a changelog partition
holds more than ``errors.dead_letter_threshold`` of them. Raising the threshold to let
old ones pass would also let that many *new* ones pass unseen, in every partition, from
then on. So instead the dead letters present when someone examined them are marked, one
mark per topic partition, and only the others count.

A mark covers a dead letter when its offset is at or below the mark's and Kafka stamped
it no later than the mark was made. The offset alone is not enough: a topic deleted and
created again starts its offsets over, and its new dead letters would fall under the old
mark. Within a partition the changelog is written in offset order, so every record at or
below the highest offset present when the mark was made had already been decoded then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ExaminedMark:
    """The dead letters of one topic partition up to ``through_offset``, examined at ``at``."""

    topic: str
    partition: int
    through_offset: int
    at: datetime


ExaminedMarks = Mapping[tuple[str, int], ExaminedMark]


def latest_marks(marks: Iterable[ExaminedMark]) -> dict[tuple[str, int], ExaminedMark]:
    """Each topic partition's newest mark: a later examination replaces an earlier one."""
    latest: dict[tuple[str, int], ExaminedMark] = {}
    for mark in sorted(marks, key=lambda m: m.at):
        latest[(mark.topic, mark.partition)] = mark
    return latest


def marks_for(present: Iterable[tuple[str, int, int]], at: datetime) -> list[ExaminedMark]:
    """The marks that cover every dead letter ``present`` (topic, partition, offset) now."""
    highest: dict[tuple[str, int], int] = {}
    for topic, partition, offset in present:
        highest[(topic, partition)] = max(offset, highest.get((topic, partition), offset))
    return [ExaminedMark(t, p, o, at) for (t, p), o in sorted(highest.items())]
