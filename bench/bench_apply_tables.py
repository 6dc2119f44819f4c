"""Stream apply throughput, one table and ten tables, cold and warm, against a plain consume.

Issue 16's throughput line: events/s applied into changelog + current by the stream
apply (``StreamApply``, what ``cdc-platform apply`` runs), for one table and for ten
tables of one source at once, against a plain confluent-kafka consume of the same offsets
in the same run (the floor).

Each case is measured twice with one engine (one ``StreamApply``, one Spark session):

* **cold**: its first batch, as a scheduled run (``AvailableNow``) or a restarted apply
  pays it: the decoding plan's code generated and compiled for the table's schema, the
  changelog created;
* **warm**: the next changes through the same engine, what a running ``cdc-platform
  apply`` sustains. ``bench_lake.py`` reports the cold figure only.

The tables are ``bench_lake.py``'s shape (bigint key, numeric, text, timestamptz, jsonb) in
the dev stack; each starts from a generation, then every round updates ``--changes`` rows
spread evenly over the case's tables (one change event each), captured by the platform's
own capture before the apply starts, so the apply's figure is not capture's.

The floor is the faster of two consumes (the first of records the broker has not served
yet moved by 4x between runs).

Run: make bench   (or .venv/bin/python bench/bench_apply_tables.py [--rows 1000000 --changes 200000])
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass

import bench_lake
from confluent_kafka import TopicPartition

from cdc_platform.config import PlatformConfig
from cdc_platform.config.model import ApplyConfig, ApplyEngine
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.apply import StreamApply
from cdc_platform.lake.session import get_spark_session
from cdc_platform.lake.tables import lake_table
from cdc_platform.sources import CaptureSettings, open_source

Offsets = dict[str, dict[int, int]]  # topic -> partition -> end offset


@dataclass
class Round:
    events: int
    apply_s: float
    consumed: int
    consume_s: float

    @property
    def rate(self) -> float:
        return self.events / self.apply_s

    @property
    def floor(self) -> float:
        return self.consumed / self.consume_s


def end_offsets(kafka: KafkaClients, topics: list[str]) -> Offsets:
    return {t: kafka.end_offsets(t) for t in topics}


def consume(config: PlatformConfig, before: Offsets, after: Offsets) -> tuple[int, float]:
    """The records between two end-offset readings, consumed plainly (the floor)."""
    consumer = KafkaClients(config.kafka).consumer("bench_floor")
    spans = [(t, p, before[t].get(p, 0), end) for t, parts in after.items() for p, end in parts.items()]
    spans = [s for s in spans if s[3] > s[2]]
    started = time.perf_counter()
    consumer.assign([TopicPartition(t, p, start) for t, p, start, _ in spans])
    remaining = {(t, p): end for t, p, _, end in spans}
    count = 0
    while remaining:
        for msg in consumer.consume(10_000, timeout=5):
            where = (msg.topic(), msg.partition())
            if msg.error() or where not in remaining:
                continue
            count += 1
            if msg.offset() + 1 >= remaining[where]:
                del remaining[where]
    elapsed = time.perf_counter() - started
    consumer.close()
    return count, elapsed


def update_round(config: PlatformConfig, names: list[str], changes: int, round_no: int) -> None:
    """``changes`` updates spread over the tables, then captured into Kafka."""
    per_table = changes // len(names)
    with app_connect(profile("dev")) as app:
        for name in names:
            app.execute(f"UPDATE {name} SET amount = amount + {round_no} WHERE id <= %s", (per_table,))
    open_source(config, "shop").capture(CaptureSettings(until_caught_up=True, status_interval_s=3600)).run()


def measure_case(config: PlatformConfig, lake: Lake, changes: int) -> list[Round]:
    """The case's tables from a generation, then a cold and a warm round through one engine."""
    names = [t.name.split(".")[-1] for t in config.tables]
    for table in config.tables:
        lake.snapshot(table.key, "g1")
    open_source(config, "shop").capture(CaptureSettings(until_caught_up=True, status_interval_s=3600)).run()
    tables = [lake_table(config, t) for t in config.tables]
    topics = [t.topic for t in tables]
    rounds = []
    with StreamApply(lake.spark, lake.ledger, lake.kafka, tables, ApplyConfig(engine=ApplyEngine.STREAM)) as engine:
        engine.run_until_caught_up()  # the generation's frontier: nothing between it and capture's start
        for round_no in (1, 2):
            before = end_offsets(lake.kafka, topics)
            update_round(config, names, changes, round_no)
            after = end_offsets(lake.kafka, topics)
            started = time.perf_counter()
            applied = engine.run_until_caught_up()
            apply_s = time.perf_counter() - started
            events = sum(a.changelog.rows for a in applied if a.changelog is not None)
            # the floor's best of two: a first consume of records the broker has not served yet
            # took 1.2 s one run and 0.3 s the next (the ratio then measured the broker's cache)
            consumed, consume_s = min((consume(config, before, after) for _ in range(2)), key=lambda c: c[1])
            rounds.append(Round(events, apply_s, consumed, consume_s))
    return rounds


def run_case(rows: int, changes: int, count: int) -> list[Round]:
    """``count`` tables of ``rows / count`` rows each, measured by ``measure_case``."""
    tag = uuid.uuid4().hex[:6]
    names = [f"bench_apply_{tag}_{i}" for i in range(count)]
    config = bench_lake.with_decoder(bench_lake.prepare(rows // count, tag, tables=names), "jvm")
    # one local session for both cases (getOrCreate): the ten tables' cold round is cold for
    # their schemas, not for Spark itself
    spark = get_spark_session(config.spark.model_copy(update={"master": "local[*]"}))
    try:
        return measure_case(config, Lake(config, spark), changes)
    finally:
        bench_lake.cleanup(config, tag, names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in all, split over the case's tables")
    parser.add_argument("--changes", type=int, default=200_000, help="changes per round, split over the tables")
    args = parser.parse_args()
    results = {("1 table" if n == 1 else f"{n} tables"): run_case(args.rows, args.changes, n) for n in (1, 10)}
    print(f"\nstream apply of {args.changes} changes a round into {args.rows} rows in all (floor = plain consume)")
    for label, (cold, warm) in results.items():
        for name, r in (("cold", cold), ("warm", warm)):
            print(
                f"  {label:9} {name}: {r.events} events {r.apply_s:6.2f} s ({r.rate:8.0f} ev/s)   "
                f"consume {r.consume_s:5.2f} s ({r.floor:8.0f} ev/s)   ratio apply/floor = {r.rate / r.floor:.3f}"
            )


if __name__ == "__main__":
    main()
