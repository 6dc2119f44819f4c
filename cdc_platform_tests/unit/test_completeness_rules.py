"""The pure rules behind the completeness check on busy and unfed tables: which Kafka
span's keys a comparison leaves out, and when a topic counts as unfed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.coverage import in_flight_ranges
from cdc_platform.model.feeds import FeedObservation, feed_verdict

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


def test_in_flight_span_starts_at_the_lower_of_frontier_and_read_and_ends_at_the_topic_end() -> None:
    # partition 0: current applied to 40, the read began at Kafka 50 -> 40..70 is in flight
    # partition 1: current applied past the read (60 > 45) -> from the read
    # partition 2: nothing new anywhere -> no span; partition 3: new, nothing known -> all of it
    frontier = {0: 40, 1: 60, 2: 10}
    read_from = {0: 50, 1: 45, 2: 10}
    ends = {0: 70, 1: 80, 2: 10, 3: 5}
    assert in_flight_ranges(frontier, read_from, ends) == [(0, 40, 70), (1, 45, 80), (3, 0, 5)]


def test_a_quiet_caught_up_table_has_nothing_in_flight() -> None:
    assert in_flight_ranges({0: 9}, {0: 9}, {0: 9}) == []


def test_a_frontier_beyond_the_read_end_keeps_what_current_applied_in_flight() -> None:
    # current applied offsets the later end read does not show yet (a racing reader)
    assert in_flight_ranges({0: 30}, {0: 20}, {0: 25}) == [(0, 20, 30)]


def _seen(changes: int, ends: dict[int, int], confirmed: bool = True, minutes: int = 0) -> FeedObservation:
    return FeedObservation(T0 + timedelta(minutes=minutes), changes, ends, confirmed)


def test_source_changes_with_a_still_topic_is_unfed() -> None:
    verdict = feed_verdict(_seen(100, {0: 7}), _seen(112, {0: 7, 1: 0}, minutes=5))
    assert verdict is not None and verdict.unfed and (verdict.source_changes, verdict.topic_events) == (12, 0)
    assert "wrote 12 row(s) since 2026-11-24 10:00:00 UTC while the topic received 0 event(s)" in verdict.describe(T0)


def test_a_topic_that_moved_or_a_quiet_source_is_fed() -> None:
    moved = feed_verdict(_seen(100, {0: 7}), _seen(112, {0: 7, 1: 3}))
    assert moved is not None and not moved.unfed and moved.topic_events == 3
    quiet = feed_verdict(_seen(100, {0: 7}), _seen(100, {0: 7}))
    assert quiet is not None and not quiet.unfed


def test_no_verdict_without_an_earlier_reading_confirmation_or_after_a_stats_reset() -> None:
    assert feed_verdict(None, _seen(5, {0: 1})) is None
    assert feed_verdict(_seen(5, {0: 1}), _seen(9, {0: 1}, confirmed=False)) is None
    assert feed_verdict(_seen(500, {0: 1}), _seen(9, {0: 1})) is None  # pg_stat_reset, or a crash


def test_the_ledger_keeps_the_newest_feed_reading_per_table(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    assert ledger.last_feed("s.t") is None
    ledger.record_feed("s.t", _seen(10, {0: 3, 1: 4}))
    ledger.record_feed("s.t", _seen(15, {0: 5, 1: 4}, minutes=1))
    ledger.record_feed("other.t", _seen(99, {0: 1}, minutes=2))
    assert ledger.last_feed("s.t") == _seen(15, {0: 5, 1: 4}, minutes=1)


def test_the_history_checks_name_each_fault_they_counted_and_only_those() -> None:
    from cdc_platform.lake.compare import ExactComparison, RowComparison, VersionChain
    from cdc_platform.orchestration.metadata import chain_check_metadata, chain_faults, history_mismatch

    chain = VersionChain(versions=10, starting_twice=1, without_end=2, sample=['starting twice {"id": 12}'])
    assert chain.faults == 3
    assert chain_faults(chain) == (
        "1 version(s) starting where another of their key starts (an event applied twice), "
        "2 closed version(s) without an end, or open one(s) with one"
    )
    metadata = chain_check_metadata(chain)
    assert (metadata["versions_checked"].value, metadata["versions_without_end"].value) == (10, 2)
    assert VersionChain(versions=10).faults == 0 and chain_faults(VersionChain(versions=10)) == ""
    mismatch = ExactComparison(rows=RowComparison(compared=4, differing=1, repeated=1))
    assert history_mismatch(mismatch) == "1 open version(s) that differ from current, 1 key(s) with two open versions"


def test_a_history_check_that_could_not_compare_warns_instead_of_passing() -> None:
    """The history check leaves the comparison out when the pin moved, a truncate is in flight
    or the in-flight span exceeds its cap. Before, it then passed (green) with only a note,
    though nothing was compared: a wrong history looked verified. Now it warns, as the
    completeness check does when it could not compare, and says why; a clean comparison
    passes and a mismatch fails with ERROR."""
    from cdc_platform.lake.compare import ExactComparison, RowComparison
    from cdc_platform.orchestration.metadata import history_check_outcome

    note = "not compared: a truncate is in flight; compare after it is applied"
    passed, warn, description = history_check_outcome(ExactComparison(note=note), "shop.public.items")
    assert (passed, warn) == (False, True)
    assert description is not None and note in description and "history" in description
    assert history_check_outcome(ExactComparison(rows=RowComparison(compared=5)), "s.t") == (True, False, None)
    passed, warn, description = history_check_outcome(ExactComparison(rows=RowComparison(compared=5, extra=1)), "s.t")
    assert (passed, warn) == (False, False)
    assert description is not None and "cdc-platform rehydrate s.t" in description


def test_the_keys_checks_name_each_finding_and_whether_a_generation_repairs_it() -> None:
    """Findings in current (the blocking ``keys`` check) are repaired by the generation the
    rehydration sensor starts; those in the topic and the changelog (``changelog_keys``)
    are not, and its description says what to do instead."""
    from cdc_platform.lake.checks import KeysReport
    from cdc_platform.orchestration.metadata import changelog_keys_check_description, keys_check_description

    clean = KeysReport(rows=5, null_keys=0, duplicate_keys=0, sample=[])
    assert keys_check_description(clean, "s.p.t") is None and changelog_keys_check_description(clean, "s.p.t") is None
    current = KeysReport(rows=5, null_keys=0, duplicate_keys=2, sample=[])
    assert keys_check_description(current, "s.p.t") == (
        "2 key(s) twice in current. Fix: current is rebuilt by a new generation, which the rehydration sensor "
        "starts (s.p.t)."
    )
    assert not current.current_passed and current.changelog_passed
    doubled = KeysReport(rows=5, null_keys=0, duplicate_keys=0, sample=[], changelog_records_twice=1)
    assert doubled.current_passed and not doubled.changelog_passed and not doubled.passed
    assert keys_check_description(doubled, "s.p.t") is None
    described = changelog_keys_check_description(doubled, "s.p.t")
    assert described is not None and described.startswith("1 Kafka record(s) twice in the changelog. Fix: ")
    assert "dropDuplicates" in described and described.endswith("none is started.")
    assert "another producer" not in described


def test_only_current_s_own_keys_block_what_reads_current() -> None:
    """A record twice in the changelog or a foreign Kafka key leaves current right (each
    record is applied once, by its position): that check warns the changelog's readers and
    does not stop current's downstream assets."""
    from cdc_platform.config.model import TableConfig
    from cdc_platform.orchestration.assets.current import check_specs
    from cdc_platform.orchestration.keys import CHANGELOG_KEYS_CHECK, KEYS_CHECK, SCHEMA_CHECK

    table = TableConfig(name="s.p.t")
    blocking = {spec.name: spec.blocking for spec in check_specs(table)}
    assert blocking[KEYS_CHECK] and blocking[SCHEMA_CHECK]
    assert blocking[CHANGELOG_KEYS_CHECK] is False


def test_completeness_over_its_dead_letter_threshold_says_what_a_generation_does_and_does_not() -> None:
    from cdc_platform.lake.checks import CompletenessReport

    within = CompletenessReport([], 0, 3, 3, 3, True, "")
    assert within.passed and within.description("s.p.t", polled=False) is None
    over = CompletenessReport([], 0, 5, 4, 3, True, "")
    described = over.description("s.p.t", polled=False)
    assert not over.passed and described is not None
    assert described.startswith(
        "5 dead letter(s) not examined, at most 4 in one changelog partition (errors.dead_letter_threshold=3)"
    )
    # the fix is to examine them and say so, not to raise the threshold (which would let as
    # many new ones pass unseen in every partition from then on)
    assert "cdc-platform dead-letters s.p.t --examined" in described and "raise" not in described
    assert "cdc-platform rehydrate s.p.t" in described
