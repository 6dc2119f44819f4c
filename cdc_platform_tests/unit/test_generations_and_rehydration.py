"""Pure decisions on generations: their order and status, which one the lake uses, when
one is in flight, and what the rehydration sensor acts on (issue 13's bugs 2 to 5, the rules
behind them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cdc_platform.model.generations import (
    Generation,
    GenerationEvent,
    GenerationStatus,
    RunState,
    Watermark,
    fold,
    in_flight,
    latest_committed,
)
from cdc_platform.model.rehydration import (
    FailedCheck,
    Need,
    Reason,
    TableFacts,
    choose,
    interrupted_generation,
    needs,
    next_attempt_at,
    pending_signals,
)

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
S = GenerationStatus


def event(name: str, status: GenerationStatus, at_s: float, **kw: object) -> GenerationEvent:
    return GenerationEvent("s.t", name, status, at=T0 + timedelta(seconds=at_s), **kw)  # type: ignore[arg-type]


def watermark(at_s: float) -> Watermark:
    return Watermark(100, {0: 5}, T0 + timedelta(seconds=at_s))


def committed(name: str, taken_s: float, cause: str = "", covers: tuple[str, ...] = ()) -> list[GenerationEvent]:
    return [
        event(name, S.REQUESTED, taken_s - 1, cause=cause, covers=covers),
        event(name, S.RUNNING, taken_s - 0.5, run_id=f"run-{name}"),
        event(name, S.COMMITTED, taken_s + 5, watermark=watermark(taken_s), rows=10),
    ]


def test_fold_keeps_the_latest_step_and_what_earlier_ones_said() -> None:
    [g] = fold(committed("g1", 10, cause="bootstrap")).values()
    assert (g.status, g.cause, g.run_id, g.rows, g.watermark) == (S.COMMITTED, "bootstrap", "run-g1", 10, watermark(10))
    # a retried step's late 'running' does not reopen a finished generation
    late = fold([*committed("g1", 10), event("g1", S.RUNNING, 100)])
    assert late["g1"].status is S.COMMITTED


def test_the_lake_uses_the_last_taken_committed_generation_whatever_its_name() -> None:
    """Bug 4: a launchpad name sorts below g2026…, and still is the newest generation."""
    generations = fold([*committed("g20261123T100000Z", 10), *committed("2026-rerun", 60)])
    chosen = latest_committed(generations.values())
    assert chosen is not None and chosen.generation == "2026-rerun"


def test_a_rejected_or_unfinished_generation_is_never_used() -> None:
    """Bug 5: a generation that failed validation is not visible to current."""
    events = [*committed("g1", 10), event("g2", S.RUNNING, 50), event("g2", S.FAILED, 60, detail="not unique")]
    events.append(event("g3", S.RUNNING, 70))
    chosen = latest_committed(fold(events).values())
    assert chosen is not None and chosen.generation == "g1"


def gens(*events: GenerationEvent) -> list[Generation]:
    return list(fold(events).values())


def test_in_flight_follows_the_run_not_the_partition_list() -> None:
    """Bug 3: a generation whose run died or failed is no longer in flight."""
    running = gens(event("g2", S.RUNNING, 0, run_id="r2"))
    now = T0 + timedelta(minutes=1)
    assert in_flight(running, {"r2": RunState(alive=True)}, 0, now) is not None
    assert in_flight(running, {"r2": RunState(alive=False, finished_unsuccessfully=True)}, 0, now) is None
    assert in_flight(running, {}, 0, now) is None  # its run is unknown: nothing is on its way


def test_a_requested_generation_is_in_flight_while_its_run_is_queued_or_new() -> None:
    requested = gens(event("g2", S.REQUESTED, 0))
    assert in_flight(requested, {}, 0, T0 + timedelta(minutes=1)) is not None
    assert in_flight(requested, {}, 1, T0 + timedelta(hours=1)) is not None  # its run waits in the queue
    assert in_flight(requested, {}, 0, T0 + timedelta(hours=1)) is None  # never launched


def facts(generations: list[Generation], **kw: object) -> TableFacts:
    return TableFacts("s.t", generations, latest_committed(generations), **kw)  # type: ignore[arg-type]


def test_needs_in_order_of_urgency() -> None:
    assert [n.reason for n in needs(facts([]), T0)] == [Reason.BOOTSTRAP]
    g = gens(*committed("g1", 10))
    found = needs(
        facts(
            g,
            signals=["signal:src:a", "signal:src:b"],
            position_lost="slot gone",
            needed_offsets={0: 30},
            kafka_earliest={0: 31},
            current_built=True,
            current_exists=False,
            failed_checks=[
                FailedCheck("schema_compatible", "run9", "qty narrowed"),
                FailedCheck("keys", "run9", "dup"),
            ],
        ),
        T0,
    )
    assert [n.reason for n in found] == [
        Reason.MANUAL, Reason.SOURCE_POSITION_LOST, Reason.CHANGELOG_GAP, Reason.CURRENT_MISSING,
        Reason.SCHEMA_INCOMPATIBLE, Reason.CHECKS_FAILED,
    ]  # fmt: skip
    manual = found[0]
    assert (manual.cause, manual.covers) == ("signal:src:a", ("signal:src:b",))  # one generation answers both
    assert found[2].cause == "gap:g1" and found[5].cause == "keys:run9"


def test_many_signal_rows_ask_for_one_generation_and_are_answered_once() -> None:
    """Bug 2: 1 001 signal rows start one generation, and none after it."""
    rows = [f"signal:shop:s{i}" for i in range(1001)]
    [need] = needs(facts([], signals=rows), T0)[1:]
    assert need.cause == rows[0] and len(need.covers) == 1000
    answered = gens(*committed("g2", 50, cause=need.cause, covers=need.covers))
    assert pending_signals(rows, answered) == []
    assert pending_signals([*rows, "signal:shop:new"], answered) == ["signal:shop:new"]


def test_a_cause_starts_one_generation() -> None:
    need = Need("s.t", Reason.CHANGELOG_GAP, "gap", "gap:g1")
    done = gens(*committed("g1", 10), *committed("g2", 50, cause="gap:g1"))
    assert choose([need], done, None, T0 + timedelta(hours=1)).need is None
    decision = choose([need], gens(*committed("g1", 10)), None, T0)
    assert decision.need == need and decision.attempt == 1


def test_nothing_starts_while_a_generation_is_in_flight() -> None:
    flying = gens(event("g2", S.RUNNING, 0, run_id="r2"))[0]
    decision = choose([Need("s.t", Reason.MANUAL, "signal", "signal:x")], [flying], flying, T0)
    assert decision.need is None and "g2 in flight" in decision.waiting


def test_a_failed_cause_is_tried_again_after_a_growing_pause() -> None:
    need = Need("s.t", Reason.CHANGELOG_GAP, "gap", "gap:g1")
    failed = gens(*committed("g1", 10), event("g2", S.RUNNING, 100, cause="gap:g1"), event("g2", S.FAILED, 110))
    assert choose([need], failed, None, T0 + timedelta(seconds=150)).need is None  # pausing
    retry = choose([need], failed, None, T0 + timedelta(seconds=171))
    assert retry.need == need and retry.attempt == 2
    twice = [g for g in failed if g.cause] * 2
    first = next_attempt_at(twice[:1])
    second = next_attempt_at(twice)
    assert first is not None and second is not None and second - first == timedelta(seconds=60)


def test_a_resumed_generation_reopens_and_each_failed_run_lengthens_the_pause() -> None:
    """A failed chunked generation is run again under its name (a resume): its new run's
    'running' reopens it (a late event of the run that failed it does not), and every
    failed run counts toward the pause before the next attempt, as separate generations did."""
    first_run = [
        event("g2", S.REQUESTED, 100, cause="gap:g1"),
        event("g2", S.RUNNING, 101, run_id="run-a"),
        event("g2", S.FAILED, 110, run_id="run-a"),
    ]
    assert fold([*first_run, event("g2", S.RUNNING, 111, run_id="run-a")])["g2"].status is S.FAILED  # late step
    resumed = fold([*first_run, event("g2", S.RUNNING, 200, run_id="run-b")])["g2"]
    assert (resumed.status, resumed.run_id, resumed.failures) == (S.RUNNING, "run-b", 1)
    failed_twice = fold([*first_run, event("g2", S.RUNNING, 200, run_id="run-b"), event("g2", S.FAILED, 210)])["g2"]
    assert (failed_twice.status, failed_twice.failures) == (S.FAILED, 2)
    once = next_attempt_at([fold(first_run)["g2"]])
    twice = next_attempt_at([failed_twice])
    assert once == T0 + timedelta(seconds=110 + 60) and twice == T0 + timedelta(seconds=210 + 120)
    # what the sensor resumes: the cause's last generation unless it committed
    generations = gens(*committed("g1", 10, cause="gap:g0"), *first_run)
    assert interrupted_generation("gap:g1", generations) == fold(first_run)["g2"]
    assert interrupted_generation("gap:g0", generations) is None  # committed: nothing to resume
    assert interrupted_generation("other", generations) is None


def test_reconciliation_of_a_polled_table() -> None:
    g = gens(*committed("g1", 10))
    assert not needs(facts(g, reconcile_every_s=3600), T0 + timedelta(minutes=30))
    [due] = needs(facts(g, reconcile_every_s=3600), T0 + timedelta(hours=2))
    assert due.reason is Reason.RECONCILIATION and due.cause == "reconcile:g1"


def test_a_failed_check_starts_a_generation_only_for_what_a_generation_repairs(tmp_path: Path) -> None:
    """A new generation rebuilds current from the source. It repairs current's keys and
    rows and offsets the changelog misses; it cannot remove a record from the changelog, a
    dead letter, or a key the source itself holds twice. Each check evaluation used to be a
    new cause, so a failure a generation cannot repair (a record twice in the changelog, say)
    started a generation at every evaluation of a streamed table's checks, every 10 minutes,
    for as long as the record stayed among the recent ones."""
    import dagster as dg

    from cdc_platform.config import load_config
    from cdc_platform.orchestration.keys import COMPLETENESS_CHECK, KEYS_CHECK, current_asset_key
    from cdc_platform.orchestration.sensors.rehydration import failed_checks, latest_check_executions

    path = tmp_path / "c.yaml"
    path.write_text(
        "sources: {s: {database: d, user: u, password_env: P}}\nkafka: {bootstrap_servers: 'x:1'}\n"
        f"lake: {{root: {tmp_path}/lake}}\ntables: [{{name: s.public.t}}]\n"
    )
    table = load_config(path).tables[0]
    cases = [  # check, metadata of the failed evaluation, a generation repairs it
        (KEYS_CHECK, {"mismatches": 0, "changelog_records_twice": 1}, False),
        (KEYS_CHECK, {"mismatches": 0, "kafka_key_mismatches": 3}, False),
        (KEYS_CHECK, {"mismatches": 2, "duplicate_keys": 2}, True),
        (COMPLETENESS_CHECK, {"mismatches": 0, "offsets_missing": 0, "max_dead_letters_per_window": 4}, False),
        (COMPLETENESS_CHECK, {"mismatches": 0, "offsets_missing": 0, "keys_repeated_in_source": 1}, False),
        (COMPLETENESS_CHECK, {"mismatches": 0, "offsets_missing": 7}, True),
        (COMPLETENESS_CHECK, {"mismatches": 3, "offsets_missing": 0, "max_dead_letters_per_window": 4}, True),
        (COMPLETENESS_CHECK, {}, True),  # an evaluation without the counts: as before
    ]
    for check, metadata, repaired in cases:
        with dg.DagsterInstance.ephemeral() as instance:
            key = current_asset_key(table)
            failed = dg.AssetCheckEvaluation(asset_key=key, check_name=check, passed=False, metadata=metadata)
            instance.report_runless_asset_event(failed)
            found = failed_checks(latest_check_executions(instance, [table]), table, T0)
        assert [f.check for f in found] == ([check] if repaired else []), (check, metadata)
