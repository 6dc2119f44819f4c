"""Does the running demo keep up? Freshness of every table over a long run, from its log.

Start the demo (``make demo-detached``), let it run (an hour or more), then:

    .venv/bin/python bench/bench_demo_lag.py [--bucket-min 10]

Every micro-batch the stream apply logs (``.cdc/dev/logs/apply.log``) ends with how far
behind the source current stands: the time from the newest applied change's commit to
the end of the batch. This groups those lines by ``--bucket-min`` minutes of the run and
prints per bucket the batches, the lag's p50 / p95 / max over every table, and the
slowest table. Floor in the same run: the first full bucket after the start-up (the
demo's first generations and the JIT warm-up fall in the bucket before it); the ratio of
each later bucket's p95 to it shows whether the lag drifts (a demo that falls behind
grows it without bound; one that keeps up stays near 1). It also reads the demo's Dagster
instance: runs queued and in progress now (the window engine piled them up).
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / ".cdc" / "dev" / "logs" / "apply.log"
# e.g. "2026-11-26 12:26:32,834 INFO cdc_platform.apply: shop.public.orders; batch …; current: …,
#       8.8 s behind the source [8.49 s]"
LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO cdc_platform\.apply: (?P<table>[^;]+);"
    r".* (?P<lag>[\d.]+) s behind the source"
)


def batches(log: Path) -> list[tuple[datetime, str, float]]:
    """(when, table, lag in s) of every logged micro-batch that applied changes."""
    found = []
    with log.open(errors="replace") as handle:
        for line in handle:
            match = LINE.match(line)
            if match and " batch " in line:
                found.append((datetime.fromisoformat(match["at"]), match["table"], float(match["lag"])))
    return found


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def by_bucket(rows: list[tuple[datetime, str, float]], minutes: int) -> list[tuple[datetime, list[tuple[str, float]]]]:
    start = rows[0][0]
    buckets: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for at, table, lag in rows:
        buckets[int((at - start).total_seconds() // (minutes * 60))].append((table, lag))
    return [(start + timedelta(minutes=minutes * i), buckets[i]) for i in sorted(buckets)]


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
    floor = percentile([lag for _, lag in buckets[1][1]], 0.95) if len(buckets) > 2 else None
    span = (rows[-1][0] - rows[0][0]).total_seconds() / 60
    print(f"demo freshness from {args.log} ({span:.0f} min, {len(rows)} micro-batches, {args.bucket_min}-min buckets)")
    print(f"{'from':<9}{'batches':>8}{'lag p50':>9}{'p95':>8}{'max':>8}{'/floor p95':>12}  slowest table (p95)")
    for begins, entries in buckets:
        lags = [lag for _, lag in entries]
        per_table: dict[str, list[float]] = defaultdict(list)
        for table, lag in entries:
            per_table[table].append(lag)
        slowest = max(per_table, key=lambda t: percentile(per_table[t], 0.95))
        p95 = percentile(lags, 0.95)
        ratio = f"{p95 / floor:.2f}" if floor else "-"
        print(
            f"{begins:%H:%M}    {len(lags):>8}{statistics.median(lags):>8.1f}s{p95:>7.1f}s{max(lags):>7.1f}s"
            f"{ratio:>12}  {slowest} ({percentile(per_table[slowest], 0.95):.1f} s)"
        )
    runs = queued_runs()
    if runs is not None:
        print(f"Dagster runs now: {runs[0]} queued, {runs[1]} in progress")


if __name__ == "__main__":
    main()
