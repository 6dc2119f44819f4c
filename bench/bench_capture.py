"""Capture throughput (events/s) against the floor: pg_recvlogical decoding the same WAL.

For each workload (the demo shop workload, then pgbench's TPC-B-like one) two logical
slots are created at the same position; the workload runs (not timed); then
``pg_recvlogical`` streams slot A to /dev/null with the same plugin and publication
(the raw decoding rate: what PostgreSQL can send), and the platform's capture streams
slot B into Kafka, acknowledged (decode + envelope + produce + ack). Both stop at the
same end position. Prints both rates and their ratio.

Run: make bench   (or .venv/bin/python bench/bench_capture.py [--seconds 15])
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import uuid
from dataclasses import dataclass

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.devtools.demo.setup import setup_demo
from cdc_platform.devtools.demo.workload import run_workload
from cdc_platform.devtools.stack import profile, stack_up
from cdc_platform.devtools.stack.postgres import LocalPostgres, bin_dir
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.devtools.stack.stack import load_stack_env
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.postgres.slot import create_slot, current_wal_position, drop_slot


@dataclass
class Result:
    workload: str
    events: int
    floor_s: float
    capture_s: float

    def line(self) -> str:
        floor_rate = self.events / self.floor_s
        rate = self.events / self.capture_s
        return (
            f"{self.workload:8s} events={self.events:7d}  pg_recvlogical {self.floor_s:6.2f} s ({floor_rate:9.0f} ev/s)"
            f"  capture {self.capture_s:6.2f} s ({rate:8.0f} ev/s)  ratio capture/floor = {rate / floor_rate:.3f}"
        )


def bench_source(config: PlatformConfig, source: str, run_workload_fn: object, label: str) -> Result:
    prof = profile("dev")
    pg = LocalPostgres(prof)
    database = config.sources[source].database
    tag = uuid.uuid4().hex[:6]
    floor_slot, our_slot = f"bench_floor_{tag}", f"bench_ours_{tag}"
    prefix = f"bench{tag}"
    src = config.sources[source].model_copy(update={"slot_name": our_slot, "topic_prefix": prefix})
    bench_config = config.model_copy(
        update={"sources": {**config.sources, source: src}, "tables": [t for t in config.tables if t.source == source]}
    )
    with pg.admin_connect(database) as admin:
        for slot in (floor_slot, our_slot):
            create_slot(admin, slot)
    publication = config.sources[source].publication or f"cdc_{source}"  # type: ignore[union-attr]
    try:
        # topics and type lookups before the timed part
        open_source(bench_config, source).capture(CaptureSettings(until_caught_up=True)).preflight()  # type: ignore[attr-defined]
        run_workload_fn()  # type: ignore[operator]
        with pg.admin_connect(database) as admin:
            end = current_wal_position(admin)

        env = {**os.environ, "PGPASSWORD": os.environ["CDC_PG_PASSWORD"]}
        start = time.perf_counter()
        subprocess.run(
            [
                str(bin_dir() / "pg_recvlogical"),
                "-h", "127.0.0.1", "-p", str(prof.pg_port), "-U", "cdc_capture", "-d", database,
                "--slot", floor_slot, "--start", "--no-loop", "-E", format_lsn(end), "-f", "/dev/null",
                "-o", "proto_version=1", "-o", f"publication_names={publication}",
            ],
            env=env, check=True,
        )  # fmt: skip
        floor_s = time.perf_counter() - start

        capture = open_source(bench_config, source).capture(
            CaptureSettings(until_caught_up=True, status_interval_s=3600)
        )
        start = time.perf_counter()
        stats = capture.run()
        capture_s = time.perf_counter() - start
        events = sum(stats.events.values())  # type: ignore[attr-defined]
        return Result(label, events, floor_s, capture_s)
    finally:
        with pg.admin_connect(database) as admin:
            for slot in (floor_slot, our_slot):
                drop_slot(admin, slot)
        admin_client = KafkaClients(config.kafka).admin()
        doomed = [t for t in admin_client.list_topics(timeout=10).topics if prefix in t]
        if doomed:
            for future in admin_client.delete_topics(doomed).values():
                future.result(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="workload duration per run")
    args = parser.parse_args()
    prof = profile("dev")
    stack_up(prof)
    load_stack_env(prof)
    list(setup_demo(prof))
    config = load_config(REPO_ROOT / "cdc_platform.yaml")

    def shop() -> None:
        run_workload(prof, rate=100_000, seconds=args.seconds, seed=1)  # as fast as one client goes

    def pgbench() -> None:
        from cdc_platform.devtools.demo.setup import _pgbench

        _pgbench(prof, ["-T", str(int(args.seconds)), "-c", "2", "-j", "2", "-n"])

    results = [bench_source(config, "shop", shop, "shop"), bench_source(config, "bench", pgbench, "pgbench")]
    print("\ncapture throughput (same run, same WAL; floor = pg_recvlogical to /dev/null)")
    for result in results:
        print(result.line())


if __name__ == "__main__":
    main()
