"""Does the running demo keep up? Freshness of every table over a long run, from its log.

Start the demo (``make demo-detached``), let it run (an hour or more), then:

    .venv/bin/python bench/bench_demo_lag.py [--bucket-min 10]

Every micro-batch the stream apply logs (``.cdc/dev/logs/apply.log``) ends with how many
changes it applied, how far behind the source current stands once it is done (the newest
change's commit to the batch's end: the least any of its changes waited) and how long
its oldest change waited (the oldest change's commit to the batch's end: the most). A
change committed while the table's previous batch ran waits for it and for this one, so
"behind" alone understates commit -> current by up to a table's whole cycle. The bench
takes each batch's changes as committed evenly between its oldest and newest, so their
waits spread evenly between the two figures, and gives the changes' commit -> current
p50 / p95 / max per ``--bucket-min`` minutes of the run, weighted by changes. Beside it,
"behind at the end" p50 and the slowest table. Floor in the same run: the first full
bucket after the start-up (the demo's first generations and the JIT warm-up fall in the
bucket before it); each later bucket's p95 over it shows whether the lag drifts (a demo
that falls behind grows it without bound; one that keeps up stays near 1). It also reads
the demo's Dagster instance: runs queued and in progress now.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / ".cdc" / "dev" / "logs" / "apply.log"
# e.g. "2026-11-26 12:26:32,834 INFO cdc_platform.apply: shop.public.orders; batch …; current: 136
#       change(s) applied, 9911 rows, 8.8 s behind the source, oldest change 41.2 s after its
#       commit; … [8.49 s]" (logs before 2026-11-29 have no "oldest change")
LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO cdc_platform\.apply: (?P<table>[^;]+);"
    r".* (?P<changes>\d+) change\(s\) applied,.* (?P<lag>[\d.]+) s behind the source"
    r"(?:, oldest change (?P<oldest>[\d.]+) s after its commit)?"
)
SPREAD = 20  # points a batch's changes are spread over between its newest and oldest wait


@dataclass(frozen=True)
class Batch:
    at: datetime
    table: str
    changes: int
    behind_s: float  # the newest change's wait: commit -> current, the least of the batch
    oldest_s: float  # the oldest change's wait, the most (= behind_s in older logs)

    def waits(self) -> list[tuple[float, float]]:
        """(wait, weight) of its changes, taken as committed evenly over the batch's span."""
        if self.changes <= 0:
            return []
        points = min(SPREAD, self.changes)
        step = (self.oldest_s - self.behind_s) / max(1, points - 1)
        return [(self.behind_s + i * step, self.changes / points) for i in range(points)]


def batches(log: Path) -> list[Batch]:
    """Every logged micro-batch that applied changes."""
    found = []
    with log.open(errors="replace") as handle:
        for line in handle:
            match = LINE.match(line)
            if match and " batch " in line:
                behind = float(match["lag"])
                oldest = float(match["oldest"]) if match["oldest"] else behind
                found.append(
                    Batch(datetime.fromisoformat(match["at"]), match["table"], int(match["changes"]), behind, oldest)
                )
    return found


def weighted_percentile(waits: list[tuple[float, float]], share: float) -> float:
    ordered = sorted(waits)
    total, seen = sum(w for _, w in ordered), 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= share * total:
            return value
    return ordered[-1][0]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def by_bucket(rows: list[Batch], minutes: int) -> list[tuple[datetime, list[Batch]]]:
    start = rows[0].at
    buckets: dict[int, list[Batch]] = defaultdict(list)
    for row in rows:
        buckets[int((row.at - start).total_seconds() // (minutes * 60))].append(row)
    return [(start + timedelta(minutes=minutes * i), buckets[i]) for i in sorted(buckets)]


def latency_p95(entries: list[Batch]) -> float:
    return weighted_percentile([w for b in entries for w in b.waits()], 0.95)


def queued_runs() -> tuple[int, int] | None:
    """Runs queued and in progress in the demo's Dagster instance (DAGSTER_HOME: the repo)."""
    import os

    os.environ.setdefault("DAGSTER_HOME", str(REPO))
    try:
        import dagster as dg

        from cdc_platform.devtools.stack import PROFILES
        from cdc_platform.devtools.stack.stack import load_stack_env

        load_stack_env(PROFILES["dev"])  # the password of the instance's storage (dagster.yaml)

        instance = dg.DagsterInstance.get()
        queued = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
        running = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    except Exception as exc:  # a report, not a failure: say why it is missing
        print(f"(Dagster instance not read: {exc})")
        return None
    return queued, running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=LOG)
    parser.add_argument("--bucket-min", type=int, default=10)
    args = parser.parse_args()
    rows = batches(args.log)
    if not rows:
        raise SystemExit(f"no applied micro-batches in {args.log}: is the demo running (make demo-detached)?")
    buckets = by_bucket(rows, args.bucket_min)
    floor = latency_p95(buckets[1][1]) if len(buckets) > 2 else None
    span = (rows[-1].at - rows[0].at).total_seconds() / 60
    print(f"demo freshness from {args.log} ({span:.0f} min, {len(rows)} micro-batches, {args.bucket_min}-min buckets)")
    print("commit -> current of the changes (weighted by changes), and 'behind' at each batch's end")
    print(
        f"{'from':<9}{'batches':>8}{'changes':>9}{'p50':>8}{'p95':>8}{'max':>8}{'/floor p95':>12}"
        f"{'behind p50':>12}  slowest table (p95)"
    )
    for begins, entries in buckets:
        waits = [w for b in entries for w in b.waits()]
        per_table: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for b in entries:
            per_table[b.table] += b.waits()
        slowest = max(per_table, key=lambda t: weighted_percentile(per_table[t], 0.95))
        p95 = weighted_percentile(waits, 0.95)
        ratio = f"{p95 / floor:.2f}" if floor else "-"
        behind = statistics.median(b.behind_s for b in entries)
        print(
            f"{begins:%H:%M}    {len(entries):>8}{sum(b.changes for b in entries):>9}"
            f"{weighted_percentile(waits, 0.5):>7.1f}s{p95:>7.1f}s{max(b.oldest_s for b in entries):>7.1f}s"
            f"{ratio:>12}{behind:>11.1f}s  {slowest} ({weighted_percentile(per_table[slowest], 0.95):.1f} s)"
        )
    runs = queued_runs()
    if runs is not None:
        print(f"Dagster runs now: {runs[0]} queued, {runs[1]} in progress")


if __name__ == "__main__":
    main()
