"""A source's history after a generation and capture's delivery of it, at least once:
random, from a seed, for model-based tests of the merges (current's in
``spark/test_current.py``, history's in ``spark/test_history.py``). The model is the
source itself: after any batch the lake must describe the source as of the newest change
delivered so far, however often earlier ones were re-sent and wherever batches were cut."""

from __future__ import annotations

from typing import Any

TRUNCATE_RATE = 0.04
Event = tuple[str, int, int, int]  # (op, id, v, commit position): spark/synthetic.StreamedTable's


def source_history(rng: Any, generation: dict[int, int], changes: int) -> list[tuple[Event, bool]]:
    """What the source did after the generation's watermark (50), in commit order: inserts of
    absent keys, updates (a third of them not carrying ``v``, an unchanged TOASTed value)
    and deletes of present ones, re-inserts of deleted ones, now and then a truncate.
    (event, TOASTed) each."""
    rows, history = dict(generation), []
    for position in range(51, 51 + changes):
        key = rng.randrange(1, 16)
        if rng.random() < TRUNCATE_RATE:
            rows.clear()
            history.append((("t", 0, 0, position), False))
        elif key not in rows:
            rows[key] = position
            history.append((("c", key, position, position), False))
        elif rng.random() < 0.25:
            del rows[key]
            history.append((("d", key, 0, position), False))
        else:
            toasted = rng.random() < 0.35
            rows[key] = rows[key] if toasted else position
            history.append((("u", key, 0 if toasted else position, position), toasted))
    return history


def delivered(rng: Any, history: list[tuple[Event, bool]]) -> list[list[int]]:
    """Capture's delivery of ``history`` (indexes), at least once, in batches: now and then a
    restart re-sends from a point up to 8 events back, and the apply cuts batches anywhere."""
    sent, next_event = [], 0
    while next_event < len(history):
        if sent and rng.random() < 0.12:
            next_event = max(0, next_event - rng.randrange(1, 9))  # re-sent from an earlier point
        sent.append(next_event)
        next_event += 1
    batches = []
    while sent:
        size = rng.randrange(1, 13)
        batches.append(sent[:size])
        sent = sent[size:]
    return batches


def stale_resends(history: list[tuple[Event, bool]], batches: list[list[int]]) -> set[str]:
    """The replays the delivery holds: an event's op when it was re-sent after a later change
    of its key was delivered (an update must not move the row back, an insert must not
    bring it back after its delete, a delete must not remove a re-insert), and ``after t``
    when an insert or update was re-sent after a later truncate was delivered."""
    kinds, delivered = set(), []
    for i in (i for batch in batches for i in batch):
        (op, key, _, _), _ = history[i]
        later = [history[j][0] for j in delivered if j > i]
        if any(event[1] == key and event[0] != "t" for event in later):
            kinds.add(op)
        if op in ("c", "u") and any(event[0] == "t" for event in later):
            kinds.add("after t")
        delivered.append(i)
    return kinds


def rows_after(generation: dict[int, int], history: list[tuple[Event, bool]], applied: int) -> dict[int, int]:
    """The source's rows once its first ``applied`` changes committed: what current must hold."""
    rows = dict(generation)
    for (op, key, value, _), toasted in history[:applied]:
        if op == "t":
            rows.clear()
        elif op == "d":
            rows.pop(key)
        elif not toasted:
            rows[key] = value
    return rows


def batch_events(history: list[tuple[Event, bool]], batch: list[int]) -> tuple[list[Event], frozenset[int]]:
    """A batch's events and which of them (their indexes in the batch) do not carry ``v``."""
    return [history[i][0] for i in batch], frozenset(n for n, i in enumerate(batch) if history[i][1])


def versions_after(history: list[tuple[Event, bool]], applied: int) -> list[tuple[int, int, str, int, int | None]]:
    """SCD2 versions of the first ``applied`` changes, from an empty history: (id, v, op,
    opening position, closing position or None while open), sorted. Each insert or update
    opens one and closes the key's open one; a delete closes it, a truncate every one; an
    update not carrying ``v`` keeps the previous version's."""
    closed, open_versions = [], {}
    for (op, key, value, position), toasted in history[:applied]:
        if op == "t":  # closes every open version
            closed += [(k, v, o, start, position) for k, (v, o, start) in open_versions.items()]
            open_versions.clear()
            continue
        previous = open_versions.pop(key, None)
        if previous is not None:
            closed.append((key, previous[0], previous[1], previous[2], position))
        if op != "d":
            kept = previous[0] if toasted and previous is not None else value
            open_versions[key] = (kept, op, position)
    now_open = [(key, v, op, start, None) for key, (v, op, start) in open_versions.items()]
    return sorted(closed + now_open, key=lambda version: (version[0], version[3]))
