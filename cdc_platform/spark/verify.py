"""Equivalence: is current exactly the source? (``cdc-platform verify``)

For each table: read the source position P, wait until capture has confirmed P (every
change committed before it is in Kafka), note the topic's end offsets E, wait until
current has applied E (its frontier; the daemon's sensors or ``cdc-platform current`` do
the applying), then compare a consistent read of the source with current row by row:
keys missing from current, extra keys, and keys whose row differs. A source that kept
changing meanwhile can differ for rows changed after P; those differences are re-checked
in further rounds (the same procedure again), and only what persists is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.envelope.lsn import format_lsn, parse_lsn
from cdc_platform.spark.checks import key_samples
from cdc_platform.spark.current import POSITION_COLUMNS, current_path, current_state
from cdc_platform.spark.snapshot import kafka_end_offsets, scratch_snapshot, source_conninfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SAMPLE = 5


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


def verify_table(
    spark: SparkSession,
    config: PlatformConfig,
    table: TableConfig,
    timeout_s: float = 600.0,
    rounds: int = 3,
    log: Callable[[str], None] = lambda _msg: None,
) -> Verdict:
    verdict = Verdict(table.key)
    started = time.monotonic()
    for round_no in range(1, rounds + 1):
        verdict = Verdict(table.key)
        position, note = _wait_until_applied(spark, config, table, started + timeout_s, log)
        verdict.position = format_lsn(position)
        verdict.waited_s = round(time.monotonic() - started, 1)
        if note:
            verdict.note = note
            return verdict
        _compare(spark, config, table, verdict)
        if verdict.ok:
            return verdict
        log(f"{table.key}: round {round_no}: {verdict.missing} missing, {verdict.extra} extra, "
            f"{verdict.mismatches} differing; checking again at a newer position")  # fmt: skip
    return verdict


def _wait_until_polled(config: PlatformConfig, table: TableConfig, deadline: float) -> tuple[int, str]:
    """A polled table: the database clock now, and a poll that began after it and read to the end."""
    from cdc_platform.capture.jdbc import connect_mysql, database_clock_ns, read_stored_cursors

    conn = connect_mysql(config.jdbc(table.source), table.source, "verify")
    try:
        position = database_clock_ns(conn)
    finally:
        conn.close()
    while True:
        cursor = read_stored_cursors(config, table.source).get(table.key)
        if cursor is not None and cursor.caught_up_at >= position:
            return position, ""
        if time.monotonic() > deadline:
            return position, (
                "the poller has not read the table to the end since verify started; is it running? start it: "
                f"cdc-platform capture run --source {table.source}"
            )
        time.sleep(1.0)


def _wait_until_applied(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, deadline: float, log: Callable[[str], None]
) -> tuple[int, str]:
    if config.is_polled(table):
        position, note = _wait_until_polled(config, table, deadline)
        if note:
            return position, note
        return position, _wait_for_current(spark, config, table, deadline, log)
    with psycopg.connect(source_conninfo(config, table), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        position = parse_lsn(str(row[0]))
        slot = config.slot_for(table.source)
        while True:
            found = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            confirmed = parse_lsn(str(found[0])) if found and found[0] else 0
            if confirmed >= position:
                break
            if time.monotonic() > deadline:
                return position, (
                    f"capture has not confirmed {format_lsn(position)} (slot {slot} at {format_lsn(confirmed)}); "
                    f"is capture running? start it: cdc-platform capture run --source {table.source}"
                )
            time.sleep(1.0)
    return position, _wait_for_current(spark, config, table, deadline, log)


def _wait_for_current(
    spark: SparkSession, config: PlatformConfig, table: TableConfig, deadline: float, log: Callable[[str], None]
) -> str:
    """Until current applied every offset Kafka holds now ('' when it did, else why not)."""
    ends = kafka_end_offsets(config, config.topic_for(table))
    topic = config.topic_for(table)
    logged = False
    while True:
        state = current_state(spark, config, table)
        frontier = {int(p): int(o) for p, o in (state or {}).get("frontier", {}).items()}
        behind = {p: e - frontier.get(p, 0) for p, e in ends.items() if frontier.get(p, 0) < e}
        if state is not None and not behind:
            return ""
        if time.monotonic() > deadline:
            return (
                f"current has not applied up to the start position ({sum(behind.values())} offsets behind in "
                f"{topic}); materialize the changelog windows and current (the daemon's sensors do, or run "
                f"cdc-platform current {table.key} once the windows are closed), or raise --timeout"
            )
        if not logged:
            log(f"{table.key}: waiting for current to apply {sum(behind.values())} more offsets")
            logged = True
        time.sleep(2.0)


def _compare(spark: SparkSession, config: PlatformConfig, table: TableConfig, verdict: Verdict) -> None:
    with scratch_snapshot(spark, config, table, "verify") as truth_result:
        truth = spark.read.format("delta").load(truth_result.path)
        keys = list(truth_result.key_columns)
        current = spark.read.format("delta").load(current_path(config, table)).drop(*POSITION_COLUMNS)
        current = current.select(*truth.columns)  # columns the source dropped are not compared
        verdict.source_rows, verdict.current_rows = truth.count(), current.count()
        only_truth = truth.exceptAll(current).select(*keys).distinct()
        only_current = current.exceptAll(truth).select(*keys).distinct()
        differing = only_truth.intersect(only_current)
        missing = only_truth.subtract(only_current)
        extra = only_current.subtract(only_truth)
        verdict.mismatches, verdict.missing, verdict.extra = differing.count(), missing.count(), extra.count()
        for label, frame in (("differs", differing), ("missing", missing), ("extra", extra)):
            verdict.sample += key_samples(frame, keys, label)


def format_verdicts(verdicts: list[Verdict]) -> str:
    header = ("table", "source rows", "current rows", "mismatches", "missing", "extra", "result")
    rows = [
        (
            v.table,
            str(v.source_rows),
            str(v.current_rows),
            str(v.mismatches),
            str(v.missing),
            str(v.extra),
            "ok" if v.ok else ("NOT VERIFIED" if v.note else "DIFFERS"),
        )
        for v in verdicts
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    for v in verdicts:
        if v.note:
            lines.append(f"{v.table}: {v.note}")
        lines += [f"{v.table}: {s}" for s in v.sample]
    return "\n".join(lines)
