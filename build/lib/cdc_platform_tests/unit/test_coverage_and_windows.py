"""Pure decisions on offsets and windows: the one coverage walk (frontier, holes), window
keys, when a window is closed, its offset ranges fixed once, which windows are due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cdc_platform.model.coverage import Hole, OffsetRange, behind, holes_not_restarted, lost_offsets, walk
from cdc_platform.model.errors import ChangelogGapError, WindowNotClosedError
from cdc_platform.model.windows import (
    PartitionFacts,
    WindowRange,
    due_windows,
    is_closed,
    parse_window_key,
    partition_key,
    plan_window,
    window_key,
    window_seconds,
    window_start,
)

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def r(partition: int, start: int, end: int) -> OffsetRange:
    return OffsetRange(partition, start, end)


def test_frontier_moves_only_across_contiguous_ranges() -> None:
    coverage = walk({0: 10, 1: 5}, [r(0, 10, 20), r(0, 20, 30), r(0, 40, 50), r(1, 0, 3)])
    assert coverage.frontier == {0: 30, 1: 5}  # partition 0 stops at the hole 30..40
    assert coverage.holes == (Hole(0, 30, 40),)
    assert coverage.offsets_missing == 10


def test_walk_takes_ranges_in_any_order_with_overlaps_and_duplicates() -> None:
    ranges = [r(0, 20, 30), r(0, 0, 10), r(0, 10, 20), r(0, 10, 20), r(0, 5, 25)]
    assert walk({}, ranges).frontier == {0: 30}  # a partition missing from the start starts at 0
    assert walk({0: 0}, ranges).holes == ()


def test_every_hole_is_named_but_the_frontier_stops_at_the_first() -> None:
    coverage = walk({0: 0}, [r(0, 0, 5), r(0, 7, 9), r(0, 12, 15)])
    assert coverage.frontier == {0: 5}
    assert [h.describe() for h in coverage.holes] == [
        "partition 0: offsets 5..6 in no window",
        "partition 0: offsets 9..11 in no window",
    ]


def test_a_day_restarted_by_a_generation_has_no_hole_but_a_real_gap_stays_one() -> None:
    """Sealing a day: a generation committed mid-day restarts the batches at its watermark;
    the offsets before it are in its snapshot (before: the seal reported them as holes, a
    false alarm logged as a bug). A gap that ends anywhere else is still a hole."""
    batches = [r(0, 0, 10), r(0, 25, 40), r(1, 0, 5), r(1, 9, 12), r(0, 50, 60)]
    holes = walk({0: 0, 1: 0}, batches).holes
    assert [(h.partition, h.start, h.end) for h in holes] == [(0, 10, 25), (0, 40, 50), (1, 5, 9)]
    restarted = holes_not_restarted(holes, [{0: 25, 1: 9}])  # the generation's watermark: 25 and 9
    assert [(h.partition, h.start, h.end) for h in restarted] == [(0, 40, 50)]
    assert holes_not_restarted(holes, []) == holes
    assert holes_not_restarted(holes, [{1: 25}]) == holes  # another partition's offset explains nothing


def test_a_partition_s_holes_are_offsets_no_batch_of_the_table_holds() -> None:
    """A table switched from hours back to days within a day: the day's partition key is its
    first hour's, so it holds hour 0's batches and the batches after the switch; the hours
    between are partitions of their own. Their offsets are in the changelog, not a hole."""
    from cdc_platform.model.windows import batch_key, partition_coverage

    day, hour_1, hour_2 = "2026-11-28T00:00:00Z", "2026-11-28T01:00:00Z", "2026-11-28T02:00:00Z"
    batches = {
        batch_key(day, 1): [r(0, 0, 10), r(1, 0, 4)],  # hour 0, hourly
        batch_key(hour_1, 2): [r(0, 10, 20)],
        batch_key(hour_2, 3): [r(0, 20, 30), r(1, 4, 9)],
        batch_key(day, 4): [r(0, 30, 35), r(1, 9, 12)],  # days again: the day's key is hour 0's
        batch_key("2026-11-29T00:00:00Z", 5): [r(0, 35, 50)],  # the next day
    }
    ranges, holes = partition_coverage(batches, day)
    assert (ranges, holes) == ({0: (0, 35), 1: (0, 12)}, ())
    assert partition_coverage(batches, hour_1) == ({0: (10, 20)}, ())
    del batches[batch_key(hour_2, 3)]  # offsets no batch holds: holes inside the day, none past its end
    assert partition_coverage(batches, day)[1] == (Hole(0, 20, 30), Hole(1, 4, 9))


def test_ranges_below_the_start_and_partitions_without_ranges() -> None:
    coverage = walk({0: 100, 2: 7}, [r(0, 0, 50), r(0, 50, 100)])  # all before the watermark
    assert coverage.frontier == {0: 100, 2: 7} and coverage.holes == ()


def test_ten_thousand_windows_since_the_watermark_are_all_covered() -> None:
    """Issue 13, bug 1: the walk sees every recorded window, however many."""
    ranges = [r(0, i * 10, i * 10 + 10) for i in range(10_050)]
    assert walk({0: 0}, reversed(ranges)).frontier == {0: 100_500}


def test_behind_and_lost_offsets() -> None:
    assert behind({0: 10, 1: 5}, {0: 12, 1: 5, 2: 3}) == 5
    assert lost_offsets({0: 30, 1: 5}, {0: 30, 1: 0}) == {}
    assert lost_offsets({0: 30, 1: 5}, {0: 31, 1: 0}) == {0: (30, 31)}


@pytest.mark.parametrize(("window", "seconds"), [("1m", 60), ("5m", 300), ("1h", 3600), ("6h", 21600), ("1d", 86400)])
def test_window_sizes_and_alignment(window: str, seconds: int) -> None:
    assert window_seconds(window) == seconds
    start = window_start(T0 + timedelta(seconds=seconds * 3 + 7), seconds)
    assert start.timestamp() % seconds == 0 and start <= T0 + timedelta(seconds=seconds * 3 + 7)
    assert parse_window_key(window_key(start)) == start


def test_window_size_must_be_valid() -> None:
    with pytest.raises(ValueError, match="not a window size"):
        window_seconds("5s")


def facts(low: int = 0, high: int = 100, at_start: int | None = 0, at_end: int | None = 50) -> PartitionFacts:
    return PartitionFacts(low, high, at_start, at_end)


def test_a_window_is_planned_from_record_times_when_no_neighbour_is_recorded() -> None:
    plan = plan_window("s.t", T0, T0 + timedelta(minutes=5), {}, {0: facts(), 1: facts(at_start=3, at_end=9)}, T0, 0)
    assert not plan.reused and plan.key == "2026-11-23T10:00:00Z"
    assert plan.ranges == (WindowRange(0, 0, 50, "2026-11-23T10:05:00Z"), WindowRange(1, 3, 9, "2026-11-23T10:05:00Z"))


def test_recorded_neighbours_fix_the_edges_and_a_recorded_window_is_reused() -> None:
    end = T0 + timedelta(minutes=5)
    recorded = {
        "2026-11-23T09:55:00Z": (WindowRange(0, 0, 42, "2026-11-23T10:00:00Z"),),
        "2026-11-23T10:05:00Z": (WindowRange(0, 77, 90, "2026-11-23T10:10:00Z"),),
    }
    plan = plan_window("s.t", T0, end, recorded, {0: facts(at_start=40, at_end=80)}, end, 0)
    assert plan.ranges == (WindowRange(0, 42, 77, "2026-11-23T10:05:00Z"),)  # the neighbours win over times
    again = plan_window("s.t", T0 - timedelta(minutes=5), T0, recorded, {0: facts()}, end, 0)
    assert again.reused and again.ranges == recorded["2026-11-23T09:55:00Z"]


def test_an_open_window_waits_and_an_idle_partition_closes_after_the_grace() -> None:
    end = T0 + timedelta(minutes=5)
    idle = {0: facts(at_end=None, high=60)}
    with pytest.raises(WindowNotClosedError, match="partition 0 has no record at or after"):
        plan_window("s.t", T0, end, {}, idle, end + timedelta(seconds=10), grace_s=30)
    plan = plan_window("s.t", T0, end, {}, idle, end + timedelta(seconds=31), grace_s=30)
    assert plan.ranges[0].end == 60


def test_offsets_kafka_no_longer_holds_are_a_gap_unless_a_newer_generation_is_past_them() -> None:
    end = T0 + timedelta(minutes=5)
    gone = {0: facts(low=20, at_start=0)}
    with pytest.raises(ChangelogGapError, match="must start at offset 0, but the earliest offset still in Kafka is 20"):
        plan_window("s.t", T0, end, {}, gone, end, 0)
    plan = plan_window("s.t", T0, end, {}, gone, end, 0, floor={0: 25})
    assert plan.ranges[0].start == 25


def test_closed_means_over_and_every_partition_past_or_the_grace_passed() -> None:
    end = T0 + timedelta(minutes=5)
    assert not is_closed(end, end - timedelta(seconds=1), 0, True)
    assert is_closed(end, end, 30, every_partition_past_end=True)
    assert not is_closed(end, end + timedelta(seconds=29), 30, every_partition_past_end=False)
    assert is_closed(end, end + timedelta(seconds=30), 30, every_partition_past_end=False)


def test_due_windows_skip_recorded_and_busy_ones_and_stop_at_now() -> None:
    now = T0 + timedelta(minutes=23)
    recorded = {"2026-11-23T10:00:00Z", "2026-11-23T10:10:00Z"}  # ledger keys
    busy = {"2026-11-23T10:05"}  # Dagster partition keys of runs under way
    due = [partition_key(s) for s, _ in due_windows(T0, 300, recorded, busy, now)]
    assert due == ["2026-11-23T10:15"]  # 10:20 has not ended at 10:23
