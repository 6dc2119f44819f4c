"""A chunked generation's plan and progress, as the ledger keeps them (pure: no I/O).

An incremental generation (``snapshot.mode: incremental``) is planned once: its watermark,
the schema it reads, and its chunks (WHERE clauses over key ranges). The chunks are
written in **waves** of ``per_wave`` chunks, one Delta commit each, tagged with the wave's
number as the commit's transaction version: a wave re-run after a crash that followed its
commit is skipped by Delta, never written twice. The ledger records the chunks of each
committed wave, so a generation run again (same name) reads only the chunks not yet
recorded, with the plan's watermark (every chunk is read after it, so the replay from it
still converges).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_platform.model.generations import Watermark


@dataclass(frozen=True)
class ChunkPlan:
    generation: str
    watermark: Watermark
    schema_hash: str  # the source table's shape when planned: a resume with another shape starts over
    source_rows: int  # the table's row count when planned (for progress; not validated)
    per_wave: int
    predicates: tuple[str, ...]

    def waves(self) -> list[tuple[int, tuple[int, ...]]]:
        """(wave number, chunk indexes), fixed by the plan: the same on every run."""
        chunks = range(len(self.predicates))
        return [(n, tuple(chunks[i : i + self.per_wave])) for n, i in enumerate(range(0, len(chunks), self.per_wave))]

    def waves_left(self, written: set[int]) -> list[tuple[int, tuple[int, ...]]]:
        """The waves with a chunk the ledger has not recorded as written."""
        return [(n, chunks) for n, chunks in self.waves() if not set(chunks) <= written]

    def to_json(self) -> str:
        return json.dumps(
            {
                "watermark": json.loads(self.watermark.to_json()), "schema_hash": self.schema_hash,
                "source_rows": self.source_rows, "per_wave": self.per_wave, "predicates": list(self.predicates),
            }
        )  # fmt: skip

    @classmethod
    def from_json(cls, generation: str, text: str) -> ChunkPlan:
        data: dict[str, Any] = json.loads(text)
        return cls(
            generation, Watermark.from_json(json.dumps(data["watermark"])), str(data["schema_hash"]),
            int(data["source_rows"]), int(data["per_wave"]), tuple(str(p) for p in data["predicates"]),
        )  # fmt: skip


@dataclass(frozen=True)
class ChunkProgress:
    """What a run of the generation finds in the ledger: its plan (None: not planned yet)
    and the chunks already written."""

    plan: ChunkPlan | None
    written: frozenset[int] = frozenset()


@dataclass(frozen=True)
class WaveProgress:
    """Where a chunked generation stands after a wave: for the run log and the UI. Rows are
    estimated from chunks (they hold equal shares of the table as planned); the rate is
    this run's (a resumed run did not read the rows before it)."""

    chunks_done: int
    chunks: int
    rows_done: int
    source_rows: int
    elapsed_s: float
    rows_this_run: int

    @property
    def rows_per_s(self) -> float:
        return self.rows_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rows_per_s
        return max(0, self.source_rows - self.rows_done) / rate if rate > 0 else None

    @property
    def share(self) -> float:
        return self.chunks_done / self.chunks if self.chunks else 1.0

    def line(self, label: str) -> str:
        eta = f"{self.eta_s:.0f} s" if self.eta_s is not None else "unknown"
        return (
            f"{label}: {self.chunks_done}/{self.chunks} chunks ({self.share:.0%}), ~{self.rows_done} of "
            f"~{self.source_rows} rows, {self.rows_per_s:.0f} rows/s, ETA {eta}"
        )


def chunk_count(rows: int, chunk_rows: int) -> int:
    """How many chunks of at most ``chunk_rows`` rows ``rows`` need."""
    return max(1, -(-rows // max(1, chunk_rows)))


def chunk_predicates(
    key: Sequence[str], boundaries: Sequence[Sequence[str]], key_nullable: bool, quote: Callable[[str], str],
    row_values: bool = True,
) -> list[str]:  # fmt: skip
    """WHERE clauses, disjoint and covering every row: ``(-inf, b1]``, ``(b1, b2]``, …,
    ``(bn, +inf)`` on the key in key order, plus the rows whose key has a NULL when a key
    column may hold one (no range comparison is true for them). ``boundaries``: each the
    key's values as the source's literals; ``quote``: the source's identifier quoting;
    ``row_values``: a composite key compared as a row value, ``(a, b) > (x, y)``, which
    PostgreSQL serves from the key's index; MariaDB scans the whole table for it (each
    chunk read every row), so there it is spelled out column by column, which its range
    optimizer serves."""
    if not boundaries:
        return ["TRUE"]
    idents = [quote(k) for k in key]
    compare = _row_comparison if row_values else _lexicographic
    # A row comparison is decided by its first unequal column: ('a', NULL) <= ('b', 5) is
    # true, so a composite key's rows with a NULL are kept out of the ranges (their chunk is
    # the last one); one column's NULL compares to nothing
    guard = "".join(f" AND {i} IS NOT NULL" for i in idents) if key_nullable and len(idents) > 1 else ""
    predicates = [f"{compare(idents, '<=', boundaries[0])}{guard}"]
    predicates += [
        f"{compare(idents, '>', low)} AND {compare(idents, '<=', high)}{guard}"
        for low, high in itertools.pairwise(boundaries)
    ]
    predicates.append(f"{compare(idents, '>', boundaries[-1])}{guard}")
    if key_nullable:
        predicates.append(" OR ".join(f"{i} IS NULL" for i in idents))
    return predicates


def _row_comparison(idents: Sequence[str], op: str, literals: Sequence[str]) -> str:
    if len(idents) == 1:
        return f"{idents[0]} {op} {literals[0]}"
    return f"({', '.join(idents)}) {op} ({', '.join(literals)})"


def _lexicographic(idents: Sequence[str], op: str, literals: Sequence[str]) -> str:
    """``(a, b, c) > (x, y, z)`` as ``(a > x OR (a = x AND (b > y OR (b = y AND c > z))))``."""
    if len(idents) == 1:
        return f"{idents[0]} {op} {literals[0]}"
    strict = op.rstrip("=")
    rest = _lexicographic(idents[1:], op, literals[1:])
    return f"({idents[0]} {strict} {literals[0]} OR ({idents[0]} = {literals[0]} AND {rest}))"
