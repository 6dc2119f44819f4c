"""Resources of the running demo: Spark JVMs and resident memory, sampled over time.

Start the demo first (``make demo-detached``), let it run, then:

    .venv/bin/python bench/bench_resources.py --seconds 120

Every ``--every`` seconds it reads /proc: each process the demo started (its pid files in
``.cdc/dev/pids``, with every descendant: Dagster's run workers, Spark's JVMs) and the
stack's services (PostgreSQL, Kafka, MariaDB, by command line). It prints, per
component, resident memory (mean and max) and the Spark JVMs it runs, and the figures the
issue asks for: Spark JVMs per streamed source in continuous mode (target: at most one),
and the platform's memory next to the floor measured in the same run, the memory of the
databases and the broker it serves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from cdc_platform.config import load_config
from cdc_platform.config.model import ApplyEngine

REPO = Path(__file__).resolve().parents[1]
PIDS = REPO / ".cdc" / "dev" / "pids"
SPARK_JVM = "org.apache.spark.deploy.SparkSubmit"
SERVICES = {"postgresql": "postgres", "kafka": "kafka.Kafka", "mariadb": "mariadbd"}


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def processes() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, command line, resident kB) of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        status = _read(f"/proc/{entry}/status")
        if not stat:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        table[int(entry)] = (parent, _read(f"/proc/{entry}/cmdline").replace("\0", " "), rss)
    return table


def demo_roots() -> dict[str, int]:
    """The demo's processes by name, from its pid files (pid and start time)."""
    roots = {}
    for path in sorted(PIDS.glob("*.pid")):
        fields = path.read_text().split()
        if fields and Path(f"/proc/{fields[0]}").exists():
            roots[path.stem] = int(fields[0])
    return roots


def owner(pid: int, table: dict[int, tuple[int, str, int]], roots: dict[int, str]) -> str | None:
    """The demo process whose tree holds ``pid`` (None: not the demo's)."""
    seen = 0
    while pid in table and seen < 64:
        if pid in roots:
            return roots[pid]
        pid, seen = table[pid][0], seen + 1
    return None


def sample(roots: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(component -> resident kB, component -> Spark JVMs) right now."""
    table = processes()
    by_pid = {pid: name for name, pid in roots.items()}
    memory: dict[str, int] = defaultdict(int)
    jvms: dict[str, int] = defaultdict(int)
    for pid, (_, command, rss) in table.items():
        name = owner(pid, table, by_pid) or next((s for s, mark in SERVICES.items() if mark in command), None)
        if name is None:
            continue
        memory[name] += rss
        jvms[name] += SPARK_JVM in command
    return memory, jvms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--config", default=str(REPO / "cdc_platform.yaml"))
    args = parser.parse_args()
    roots = demo_roots()
    if "apply" not in roots:
        print("the demo is not running (no live apply in .cdc/dev/pids): start it with `make demo-detached`")
        sys.exit(0)
    config = load_config(args.config)
    streamed = [n for n, s in config.sources.items() if s.apply.engine is ApplyEngine.STREAM]
    memory: dict[str, list[int]] = defaultdict(list)
    jvms: dict[str, list[int]] = defaultdict(list)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        mem, jvm = sample(roots)
        for name in set(mem) | set(memory):
            memory[name].append(mem.get(name, 0))
            jvms[name].append(jvm.get(name, 0))
        time.sleep(args.every)
    report(memory, jvms, streamed)


def report(memory: dict[str, list[int]], jvms: dict[str, list[int]], streamed: list[str]) -> None:
    print(f"{'component':<16}{'RSS mean MB':>12}{'RSS max MB':>12}{'Spark JVMs max':>16}")
    for name in sorted(memory):
        values = memory[name]
        print(f"{name:<16}{statistics.mean(values) / 1024:>12.0f}{max(values) / 1024:>12.0f}{max(jvms[name]):>16}")
    totals = [sum(column) for column in zip(*memory.values(), strict=True)]
    floor = [sum(memory[s][i] for s in SERVICES if s in memory) for i in range(len(totals))]
    platform = [t - f for t, f in zip(totals, floor, strict=True)]
    apply_jvms = max(jvms.get("apply", [0]))
    all_jvms = max(sum(column) for column in zip(*jvms.values(), strict=True))
    names = ", ".join(streamed)
    print(f"streamed sources: {len(streamed)} ({names}); Spark JVMs of the continuous apply: {apply_jvms}")
    print(f"Spark JVMs per streamed source (continuous mode): {apply_jvms / max(1, len(streamed)):.2f} (target <= 1)")
    print(f"Spark JVMs at once, every process of the demo (Dagster runs included): {all_jvms}")
    print(
        f"platform RSS mean {statistics.mean(platform) / 1024:.0f} MB, max {max(platform) / 1024:.0f} MB; "
        f"floor (PostgreSQL + Kafka + MariaDB) mean {statistics.mean(floor) / 1024:.0f} MB; "
        f"ratio {statistics.mean(platform) / max(1, statistics.mean(floor)):.2f}"
    )


if __name__ == "__main__":
    main()
