"""A table's dead letters, counted with the examined ones (``model.dead_letters``) apart.

Read with delta-rs (no Spark, no JVM): the completeness check and ``cdc-platform
dead-letters`` count them the same way, and the command answers in a second. Only the
columns that place a record are read, never its raw bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.delta_rs import open_table, read_columns
from cdc_platform.model.dead_letters import ExaminedMark, ExaminedMarks, marks_for

PLACING = ("window_start", "topic", "kafka_partition", "kafka_offset", "kafka_timestamp")
SAMPLE = 5


@dataclass(frozen=True)
class DeadLetterCounts:
    total: int = 0
    examined: int = 0
    # changelog partition (a window, or a streamed changelog's UTC day) -> dead letters not examined
    unexamined_by_partition: dict[str, int] = field(default_factory=dict)
    sample: list[str] = field(default_factory=list)  # unexamined ones: where, and why

    @property
    def worst_partition(self) -> int:
        """The most dead letters not examined in one changelog partition (what the threshold bounds)."""
        return max(self.unexamined_by_partition.values(), default=0)


def read_dead_letters(path: str) -> pa.Table | None:
    """Where each dead letter of the table at ``path`` came from, and why; None when the
    table has never been written."""
    delta = open_table(path)
    return None if delta is None else read_columns(delta, (*PLACING, "error"))


def count_dead_letters(data: pa.Table | None, marks: ExaminedMarks) -> DeadLetterCounts:
    if data is None or not data.num_rows:
        return DeadLetterCounts()
    unexamined = data.filter(pc.invert(examined_mask(data, marks)))
    windows = Counter(str(w) for w in unexamined["window_start"].to_pylist())
    first = unexamined.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")]).slice(0, SAMPLE)
    sample = [
        f"partition {r['kafka_partition']} offset {r['kafka_offset']} ({r['window_start']}): {r['error']}"
        for r in first.to_pylist()
    ]
    return DeadLetterCounts(data.num_rows, data.num_rows - unexamined.num_rows, dict(sorted(windows.items())), sample)


def marks_for_present(data: pa.Table | None, at: datetime) -> list[ExaminedMark]:
    """Marks that cover every dead letter in ``data`` (the table's, read now)."""
    if data is None:
        return []
    rows = data.select(["topic", "kafka_partition", "kafka_offset"]).to_pylist()
    return marks_for(((str(r["topic"]), int(r["kafka_partition"]), int(r["kafka_offset"])) for r in rows), at)


def examined_mask(data: pa.Table, marks: ExaminedMarks) -> pa.ChunkedArray:
    """True for each dead letter a mark covers: its topic partition's, at or below its offset,
    stamped by Kafka no later than the mark was made."""
    examined = pa.chunked_array([pa.array([False] * data.num_rows, pa.bool_())])
    for mark in marks.values():
        covered = pc.and_(
            pc.and_(pc.equal(data["topic"], mark.topic), pc.equal(data["kafka_partition"], mark.partition)),
            pc.and_(
                pc.less_equal(data["kafka_offset"], mark.through_offset),
                pc.less_equal(data["kafka_timestamp"], pa.scalar(mark.at, data.schema.field("kafka_timestamp").type)),
            ),
        )
        examined = pc.or_(examined, pc.fill_null(covered, False))
    return examined
