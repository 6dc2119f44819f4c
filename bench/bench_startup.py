"""A new Spark driver's start: with the class archive scripts/bootstrap.sh builds, and without.

Every Dagster run and every start of ``cdc-platform apply`` starts a driver JVM, then runs
its first Delta jobs cold. This starts fresh processes, alternating, each of which builds
the platform's session and reads a Delta table (a count, then its details), and prints the
median of each against the floor: the same without the archive (the JDK's own class
sharing only) in the same run.

    .venv/bin/python bench/bench_startup.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("CDC_SPARK_JARS_DIR", str(REPO / ".cdc" / "jars" / "spark"))


def child(table: str, archive: bool) -> dict[str, float]:
    """One driver's start, in this process: seconds to the session, then to the first read."""
    started = time.monotonic()
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake import session as session_module

    if not archive:  # the JDK's own archive only: what a driver without ours maps
        session_module.driver_archive_option = lambda _spark: None
    spark = session_module.get_spark_session(SparkConfig(master="local[2]"))
    ready = time.monotonic()
    from delta.tables import DeltaTable

    spark.read.format("delta").load(table).count()
    DeltaTable.forPath(spark, table).detail().first()
    done = time.monotonic()
    return {"session_s": ready - started, "first_read_s": done - ready, "total_s": done - started}


def make_table(path: Path) -> None:
    code = (
        "from cdc_platform.config.model import SparkConfig\n"
        "from cdc_platform.lake.session import get_spark_session\n"
        "s = get_spark_session(SparkConfig(master='local[2]'))\n"
        f"s.range(0, 100000).selectExpr('id', 'id % 7 AS day').write.format('delta').save({str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)


def run(table: Path, archive: bool) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", str(table)] + ([] if archive else ["--no-archive"])
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-archive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, archive=not args.no_archive)))
        return 0
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import class_archive

    archive = class_archive(SparkConfig())
    if archive is None or not archive.is_file():
        print(f"no class archive at {archive}: run scripts/bootstrap.sh", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        table = Path(scratch) / "t"
        make_table(table)
        results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(args.runs):
            for with_archive in (False, True):  # alternating: drift in the machine hits both alike
                results[with_archive].append(run(table, with_archive))
    print(f"driver start and first Delta read, median of {args.runs} fresh processes each (archive {archive.name})")
    print(f"{'':24}{'without (floor)':>18}{'with archive':>16}{'ratio':>8}")
    for figure in ("session_s", "first_read_s", "total_s"):
        floor = statistics.median(r[figure] for r in results[False])
        ours = statistics.median(r[figure] for r in results[True])
        print(f"{figure:24}{floor:>16.2f} s{ours:>14.2f} s{ours / floor:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
