"""Is a table's topic fed? Two observations of the source's change counter and the topic.

A topic nobody writes (a table left out of a connector's ``table.include.list``, or out
of the publication) looks exactly like a quiet table: no events, nothing behind, every
check green. What tells them apart is the source's own count of rows written
(PostgreSQL's ``pg_stat_user_tables``: inserted + updated + deleted). Between two
observations, if that count moved, the producer has confirmed a source position read
after the count, and the topic's end offsets did not move, the changes never reached
the topic.

The count includes rows of transactions that rolled back, so a table whose only writes
in the span rolled back is flagged too; the verdict names that as the other cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class FeedObservation:
    """One reading: the source's change counter, then (once the producer confirmed the
    source position read after it) the topic's end offsets."""

    at: datetime
    source_changes: int  # rows inserted + updated + deleted, as the source counts them
    topic_end: Mapping[int, int]  # partition -> end offset
    confirmed: bool  # the producer confirmed a position read after the counter


@dataclass(frozen=True)
class FeedVerdict:
    source_changes: int  # rows the source wrote between the two observations
    topic_events: int  # offsets the topic gained in the same span
    unfed: bool

    def describe(self, since: datetime) -> str:
        return (
            f"the source wrote {self.source_changes} row(s) since {since:%Y-%m-%d %H:%M:%S} UTC while the topic "
            f"received {self.topic_events} event(s)"
        )


def feed_verdict(before: FeedObservation | None, now: FeedObservation) -> FeedVerdict | None:
    """None when there is nothing to judge: no earlier reading, the producer has not
    confirmed the later one, or the source's counter went back (statistics reset)."""
    if before is None or not now.confirmed:
        return None
    changes = now.source_changes - before.source_changes
    if changes < 0:
        return None
    events = sum(max(0, end - before.topic_end.get(p, 0)) for p, end in now.topic_end.items())
    return FeedVerdict(changes, events, unfed=changes > 0 and events == 0)
