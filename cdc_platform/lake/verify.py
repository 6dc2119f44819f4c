"""Equivalence: is current exactly the source? (``cdc-platform verify``)

For each table: read the source position P, wait until capture has every change before
P in Kafka, note the topic's end offsets E, wait until current has applied E (its
frontier in the ledger; the daemon's sensors or ``cdc-platform current`` do the
applying), then compare a consistent read of the source with current row by row: keys
missing from current, extra keys, and keys whose row differs. A source that kept
changing meanwhile can differ for rows changed after P; those differences are re-checked
in further rounds (the same procedure again), and only what persists is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.checks import compare_rows
from cdc_platform.lake.current import POSITION_COLUMNS
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.snapshot import scratch_copy
from cdc_platform.lake.tables import LakeTable
from cdc_platform.model.coverage import behind
from cdc_platform.sources.base import Source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WAIT_POLL_S = 2.0


@dataclass
class Verdict:
    table: str
    source_rows: int = 0
    current_rows: int = 0
    mismatches: int = 0  # keys in both whose rows differ
    missing: int = 0  # keys in the source, not in current
    extra: int = 0  # keys in current, not in the source
    sample: list[str] = field(default_factory=list)
    position: str = ""
    waited_s: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.note and not (self.mismatches or self.missing or self.extra)


@dataclass(frozen=True)
class VerifyContext:
    spark: SparkSession
    ledger: Ledger
    source: Source
    kafka: KafkaClients
    log: Callable[[str], None] = lambda _msg: None


def verify_table(ctx: VerifyContext, table: LakeTable, timeout_s: float = 600.0, rounds: int = 3) -> Verdict:
    verdict = Verdict(table.key)
    started = time.monotonic()
    for round_no in range(1, rounds + 1):
        verdict = Verdict(table.key)
        position = ctx.source.position()
        verdict.position = ctx.source.format_position(position)
        note = ctx.source.wait_until_captured(position, started + timeout_s) or _wait_for_current(
            ctx, table, started + timeout_s
        )
        verdict.waited_s = round(time.monotonic() - started, 1)
        if note:
            verdict.note = note
            return verdict
        _compare(ctx, table, verdict)
        if verdict.ok:
            return verdict
        ctx.log(f"{table.key}: round {round_no}: {verdict.missing} missing, {verdict.extra} extra, "
                f"{verdict.mismatches} differing; checking again at a newer position")  # fmt: skip
    return verdict


def _wait_for_current(ctx: VerifyContext, table: LakeTable, deadline: float) -> str:
    """Until current applied every offset Kafka holds now ('' when it did, else why not)."""
    ends = ctx.kafka.end_offsets(table.topic)
    logged = False
    while True:
        position = ctx.ledger.current(table.key)
        unapplied = behind(position.frontier if position else {}, ends)
        if position is not None and not unapplied:
            return ""
        if time.monotonic() > deadline:
            return (
                f"current has not applied up to the start position ({unapplied} offsets behind in {table.topic}); "
                f"materialize the changelog windows and current (the daemon's sensors do, or run cdc-platform "
                f"current {table.key} once the windows are closed), or raise --timeout"
            )
        if not logged:
            ctx.log(f"{table.key}: waiting for current to apply {unapplied} more offsets")
            logged = True
        time.sleep(WAIT_POLL_S)


def _compare(ctx: VerifyContext, table: LakeTable, verdict: Verdict) -> None:
    spark = ctx.spark
    with scratch_copy(spark, ctx.source, ctx.kafka, table, "verify") as (truth, plan):
        keys = list(plan.schema.key)
        current = spark.read.format("delta").load(table.current_path).drop(*POSITION_COLUMNS)
        current = current.select(*[f"`{c}`" for c in truth.columns])  # columns the source dropped are not compared
        verdict.source_rows, verdict.current_rows = truth.count(), current.count()
        rows = compare_rows(truth, current, keys)
        verdict.mismatches, verdict.missing, verdict.extra = rows.differing, rows.missing, rows.extra
        verdict.sample = rows.sample


def format_verdicts(verdicts: list[Verdict]) -> str:
    header = ("table", "source rows", "current rows", "mismatches", "missing", "extra", "result")
    rows = [
        (v.table, str(v.source_rows), str(v.current_rows), str(v.mismatches), str(v.missing), str(v.extra),
         "ok" if v.ok else ("NOT VERIFIED" if v.note else "DIFFERS"))
        for v in verdicts
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    for v in verdicts:
        if v.note:
            lines.append(f"{v.table}: {v.note}")
        lines += [f"{v.table}: {s}" for s in v.sample]
    return "\n".join(lines)
