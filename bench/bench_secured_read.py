"""The changelog's read on a cluster that speaks TLS and authenticates, against the same
read on a plain connection in the same run.

A production Kafka has TLS and SASL. Before ``kafka/java_client.py`` the platform's
``decoder: auto`` read such a cluster with the Python reader (librdkafka in Spark's Python
workers); now it reads with Spark's Kafka source and decodes in the JVM. This bench reads
one captured topic's offsets as a stream batch's Spark path does (``changelog._read_decoded``:
Spark's Kafka source and ``jvm_decoded``, or the Python reader's ``read_ranges``) into
Spark's ``noop`` sink, fastest of ``--repeats`` rounds, each round reading
all four one after the other:

* **plain, JVM** (the floor): the dev stack's plain listener, Spark's Kafka source;
* **SASL_SSL, JVM**: the stack's SASL_SSL/SCRAM listener, what ``auto`` reads with now;
* **SASL_SSL, Python**: the same listener, what ``auto`` read with before;
* **plain, Python**: the Python reader on the plain listener, for TLS's cost to it.

It prints each one's time, records/s and ratio to the floor. The table is ``bench_lake.py``'s
shape in the dev stack, captured, then updated once per row and captured again (as
``bench_decode.py``); every record of its topic is read.

Run: make bench   (or .venv/bin/python bench/bench_secured_read.py [--rows 200000 --repeats 3])
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import bench_lake

from cdc_platform.config.model import KafkaConfig
from cdc_platform.devtools.stack import profile
from cdc_platform.devtools.stack.kafka import KAFKA_PASSWORD_ENV, KAFKA_SASL_USER
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.changelog import decodes_in_jvm, read_offsets
from cdc_platform.lake.jvm_decode import jvm_decoded, read_raw
from cdc_platform.lake.session import get_spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdc_platform.lake.tables import LakeTable
    from cdc_platform.model.tables import TableSchema


def secured() -> KafkaConfig:
    """The dev stack's SASL_SSL listener in librdkafka's names, the password by env var."""
    dev = profile("dev")
    return KafkaConfig(
        bootstrap_servers=dev.kafka_sasl_bootstrap,
        options={
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(dev.kafka_ca_file),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": KAFKA_SASL_USER,
        },
        secret_options_env={"sasl.password": KAFKA_PASSWORD_ENV},
    )


def decoded(
    spark: SparkSession, kafka: KafkaClients, table: LakeTable, spans: list[tuple[int, int, int]], schema: TableSchema
) -> DataFrame:
    """What a stream batch too big for the driver caches: in the JVM, every record decoded in
    Spark SQL (all of this table's are exact); in Python, the reader's decoded rows."""
    if decodes_in_jvm(table, kafka.kafka):
        return jvm_decoded(read_raw(spark, kafka.kafka, table.topic, spans), schema, table.encoding)
    return read_offsets(spark, kafka, table, spans, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    config = bench_lake.prepare(args.rows, tag)  # loads the stack's secrets before Spark starts
    try:
        spark = get_spark_session(config.spark)
        table, schema = bench_lake.captured_updates(config, spark)
        plain, tls = KafkaClients(config.kafka), KafkaClients(secured())
        spans = [(p, low, high) for p, (low, high) in plain.watermarks(table.topic).items()]
        records = sum(high - low for _, low, high in spans)
        assert decodes_in_jvm(table, tls.kafka), "auto must read the secured cluster in the JVM"
        ways = {
            "plain, JVM (floor)": (plain, "jvm"),
            "SASL_SSL, JVM (auto now)": (tls, "auto"),
            "SASL_SSL, Python (auto before)": (tls, "python"),
            "plain, Python": (plain, "python"),
        }
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for round_ in range(args.repeats + 1):  # rounds interleave the ways; the first warms up, dropped
            for name, (kafka, decoder) in ways.items():
                started = time.perf_counter()
                frame = decoded(spark, kafka, replace(table, decoder=decoder), spans, schema)
                frame.write.format("noop").mode("overwrite").save()
                if round_:
                    runs[name].append(time.perf_counter() - started)
        times = {name: min(seconds) for name, seconds in runs.items()}
        floor = times["plain, JVM (floor)"]
        print(f"\nThe changelog's read of {records} records (fastest of {args.repeats}, 2 cores: local[*])")
        for name, seconds in times.items():
            spread = f"(all: {', '.join(f'{r:.2f}' for r in runs[name])})"
            rate = f"{records / seconds:9.0f} rec/s"
            print(f"  {name:32s} {seconds:6.2f} s {rate} {seconds / floor:5.2f}x the floor {spread}")
    finally:
        bench_lake.cleanup(config, tag)


if __name__ == "__main__":
    main()
