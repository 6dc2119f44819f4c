"""Decoding in the JVM alone: a warm batch's Kafka records through ``jvm_decoded``, against
one JSON parse of the same values in the same run.

The stream apply spends about half of a warm 200 000-change batch reading and decoding
its records (``docs/benchmarks.md``, "Stream apply throughput"). This bench isolates the
decoding: the records of a captured topic are read once by Spark's Kafka source and cached,
then each is measured ``--repeats`` times writing to Spark's ``noop`` sink, taking the fastest:

* **scan**: the cached records only (what every figure below includes);
* **one parse (floor)**: the values' ``from_json`` with the table's envelope schema, the
  least any exact decoding must do;
* **decode**: ``jvm_decoded``, what the apply runs (the exactness checks included).

It prints the decode's time and its ratio to the floor, and how many records Spark SQL left
to the Python decoder (0 for this table's shape). The table is ``bench_lake.py``'s shape
(bigint key, numeric, text, timestamptz, jsonb) in the dev stack, one update per row.

Run: make bench   (or .venv/bin/python bench/bench_decode.py [--rows 200000 --repeats 5])
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

import bench_lake

from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake import jvm_decode
from cdc_platform.lake.session import get_spark_session


def fastest(frame: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``frame()`` into the ``noop`` sink."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        frame().write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = bench_lake.prepare(args.rows, tag)
    try:
        spark = get_spark_session(config.spark)
        table, schema = bench_lake.captured_updates(config, spark)
        from pyspark.sql import functions as F

        watermarks = KafkaClients(config.kafka).watermarks(table.topic)
        spans = [(p, low, high) for p, (low, high) in watermarks.items()]
        raw = jvm_decode.read_raw(spark, config.kafka, table.topic, spans).cache()
        records = raw.count()
        envelope = jvm_decode._envelope_wire(schema)
        text = F.col("value").cast("string")
        fastest(lambda: jvm_decode.jvm_decoded(raw, schema, table.encoding), 1)  # code generated and compiled
        scan = fastest(lambda: raw.select("key", "value"), args.repeats)
        floor = fastest(lambda: raw.select(F.from_json(text, envelope).alias("e")).select("e.*"), args.repeats)
        decode = fastest(lambda: jvm_decode.jvm_decoded(raw, schema, table.encoding), args.repeats)
        python = jvm_decode.jvm_decoded(raw, schema, table.encoding).where(~F.col("__jvm")).count()
        print(f"\nJVM decoding of {records} cached Kafka records (fastest of {args.repeats}, 2 cores: local[*])")
        print(f"  scan                 {scan:6.2f} s")
        print(f"  one parse (floor)    {floor:6.2f} s   ({records / floor:9.0f} rec/s)")
        print(f"  decode (jvm_decoded) {decode:6.2f} s   ({records / decode:9.0f} rec/s)")
        print(f"  ratio decode/floor = {decode / floor:.2f}x the floor's time; records left to Python: {python}")
    finally:
        bench_lake.cleanup(config, tag)


if __name__ == "__main__":
    main()
