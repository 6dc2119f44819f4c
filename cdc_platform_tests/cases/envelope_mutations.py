"""Records a broken or hostile producer could write: valid envelopes with one to three of
their JSON values replaced, removed or added, drawn from a fixed seed. The decoders must
give each one a change row or an error row (a dead letter), never fail the batch: one such
record would otherwise stop its table's apply for good."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

# tokens that broke a decoder before, or sit on a boundary one of them draws
TOKENS: list[Any] = [
    0, -1, 1, 2**31, 2**53 + 1, 2**62, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 253402300800000,
    -62135596800001, 1.5, -0.0, 1e308, 5e-324, float("nan"), float("inf"), "", "x", "0", "-0", "5", "1.5",
    "NaN", "\ud800", "\x00", "é", "__debezium_unavailable_value", "infinity", "2026-01-01T00:00:00Z", "AAAA",
    "ff", "[]", '["1"]', '{"a": 1}', '"5"', "{}", True, False, None, [], [1], ["a"], [None], [[1]], {}, {"a": 1},
    {"value": "AQ==", "scale": 2}, "c", "u", "d", "t", "r",
    # a column's own JSON type at its edges: these stay in the JVM decoder, its checks are what is tested
    " ", "00", "1.", ".5", "1.50", "-1.5e3", "12345678901.99", "-0.00", "AA==", "AAA=", "////", "+/+/", "AP8Q_-8",
    "00ff", "f", "\ud83d\ude00", "a\nb", "Infinity", "-Infinity", "2026-01-01T00:00:00.000000Z",
    "2026-01-01T00:00:00.Z", "2026-01-01T00:00:00.1234567Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z",
    "2026-13-01T00:00:00Z", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00+00:00", "2026-01-01T24:00:00Z",
    "2026-01-01T23:59:60Z", "+2026-01-01T00:00:00Z", "12:00:00", "$1.00", "\u0663", "\uff11",
    2**15 - 1, -(2**15), 2**15, 2**31 - 1, -(2**31), 86_400_000_000, 86_400_000_001, 253402300799999999,
    -62135596800000000, -719528, 2932896, 2932897, -5877641, 1e-45, 3.4028235e38, 3.4028236e38, 1e39, 2.5, 1e16,
]  # fmt: skip
FIELDS = ["extra", "id", "op", "payload", "schema", "sequence", "ts_ms", "lsn", "txId", "before", "after", "source"]


def mutated_records(
    bases: list[tuple[bytes | None, bytes | None]], count: int, seed: int, most: int = 3
) -> list[tuple[bytes | None, bytes | None]]:
    """``count`` records, each a base record (key, value) with its value mutated one to
    ``most`` times, and one time in five its key once."""
    rnd = random.Random(seed)
    parsed = [(key, json.loads(value)) for key, value in bases if value is not None and _is_object(value)]
    records: list[tuple[bytes | None, bytes | None]] = []
    for _ in range(count):
        key, base = rnd.choice(parsed)
        value = json.loads(json.dumps(base))
        for _ in range(rnd.randint(1, most)):
            value = _mutated(value, rnd)
        if key is not None and _is_object(key) and rnd.random() < 0.2:
            key = _dumps(_mutated(json.loads(key), rnd))
        records.append((key, _dumps(value)))
    return records


def deeply_nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels (Python's parser gives up near 1 000)."""
    return "[" * depth + "]" * depth


def _is_object(data: bytes) -> bool:
    """A JSON object shallow enough for these (recursive) mutations to walk."""
    try:
        value = json.loads(data)
        list(_paths(value))
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict)


def _dumps(value: Any) -> bytes:
    # a lone surrogate is written as its \u escape (ensure_ascii), as a producer could
    return json.dumps(value).encode()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for step, child in children:
        yield from _paths(child, (*prefix, step))


def _mutated(value: Any, rnd: random.Random) -> Any:
    """``value`` with one of its values replaced by a token, removed, or a field added."""
    paths = list(_paths(value))
    if not paths:
        return _token(rnd)
    path = rnd.choice(paths)
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    roll = rnd.random()
    if roll < 0.7 or not isinstance(parent, dict):
        parent[path[-1]] = _token(rnd)
    elif roll < 0.85:
        del parent[path[-1]]
    else:
        parent[rnd.choice(FIELDS)] = _token(rnd)
    return value


def _token(rnd: random.Random) -> Any:
    return copy.deepcopy(rnd.choice(TOKENS))  # a later mutation must not change the pool
