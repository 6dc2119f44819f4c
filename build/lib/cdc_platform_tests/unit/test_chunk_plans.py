"""A chunked generation's plan (model/chunks.py): fixed waves, what is left after a crash,
the stored form, and the progress line."""

from __future__ import annotations

from datetime import UTC, datetime

from cdc_platform.model.chunks import ChunkPlan, WaveProgress
from cdc_platform.model.generations import Watermark

PLAN = ChunkPlan("g1", Watermark(7, {0: 1, 1: 2}, datetime(2026, 11, 26, tzinfo=UTC)), "h", 10_000, 4,
                 tuple(f"chunk {i}" for i in range(10)))  # fmt: skip


def test_waves_are_fixed_groups_of_the_plans_chunks() -> None:
    assert PLAN.waves() == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7)), (2, (8, 9))]


def test_a_resumed_generation_reads_only_the_waves_not_recorded_whole() -> None:
    assert PLAN.waves_left(set()) == PLAN.waves()
    assert PLAN.waves_left({0, 1, 2, 3, 8, 9}) == [(1, (4, 5, 6, 7))]
    # a wave is recorded whole or not at all; a partial record still re-reads the wave, and
    # Delta skips its commit if it had landed (the wave's number is its transaction version)
    assert PLAN.waves_left({0, 1, 2, 3, 4}) == [(1, (4, 5, 6, 7)), (2, (8, 9))]
    assert PLAN.waves_left(set(range(10))) == []


def test_the_plan_round_trips_through_its_stored_form() -> None:
    assert ChunkPlan.from_json("g1", PLAN.to_json()) == PLAN


def test_progress_says_chunks_rows_rate_and_eta_of_this_run() -> None:
    progress = WaveProgress(5, 10, 5_000, 10_000, 2.0, 2_000)  # resumed: 3000 rows were read before
    assert progress.line("s.t: snapshot g1") == (
        "s.t: snapshot g1: 5/10 chunks (50%), ~5000 of ~10000 rows, 1000 rows/s, ETA 5 s"
    )
    assert (progress.rows_per_s, progress.eta_s, progress.share) == (1000.0, 5.0, 0.5)
    assert WaveProgress(0, 10, 0, 10_000, 0.0, 0).eta_s is None  # no rate yet: no ETA
