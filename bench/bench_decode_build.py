"""Building a table's JVM decoding: seconds and py4j round trips, per column count.

Each table an apply starts builds its decoding's Spark SQL columns once per process
(``jvm_decode._stages``): dozens of Column calls per column of each image, each a py4j round
trip or several. PySpark 4 also records each call's Python call site in the JVM unless
``spark.python.sql.dataFrameDebugging.enabled`` is false, as the platform's sessions have
it. Both are measured in one run, on fresh schemas (int4, text, numeric(10,2), timestamptz,
bool, int8, date, float8, timestamp, bytea, repeated): the platform's setting, then
PySpark's default, and the ratio between them. No service needed: a local[1] driver.

Run: make bench   (or .venv/bin/python bench/bench_decode_build.py [--columns 5 10 30])
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from cdc_platform.config.model import SparkConfig
from cdc_platform.devtools.py4j_trips import RoundTrips
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.lake import jvm_decode
from cdc_platform.lake.session import get_spark_session
from cdc_platform.model.tables import LakeColumn, TableSchema

OIDS = (23, 25, 1700, 1184, 16, 20, 1082, 701, 1114, 17)
NUMERIC_10_2 = (10 << 16 | 2) + 4  # PostgreSQL's typmod of numeric(10,2)


def fresh_schema(columns: int) -> TableSchema:
    """A schema no session built before (decodings are cached per schema)."""
    tag = uuid.uuid4().hex[:8]
    built = []
    for i in range(columns):
        oid = OIDS[i % len(OIDS)]
        pgtype = builtin_type(oid)
        assert pgtype is not None
        built.append(LakeColumn(f"c{i}_{tag}", pgtype, typmod=NUMERIC_10_2 if oid == 1700 else -1))
    return TableSchema(tuple(built), (built[0].name,))


def measure(spark: Any, columns: int, call_sites: bool) -> tuple[float, int]:
    import pyspark.errors.utils as pyspark_errors

    # a static conf, read once per process into this cache: set the cache as the conf would
    pyspark_errors._enable_debugging_cache = call_sites  # type: ignore[attr-defined]
    schema = fresh_schema(columns)
    with RoundTrips() as trips:
        started = time.perf_counter()
        jvm_decode._stages(spark, schema, ValueEncoding())
        seconds = time.perf_counter() - started
    return seconds, trips.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", type=int, nargs="+", default=[5, 10, 30])
    args = parser.parse_args()
    spark = get_spark_session(SparkConfig(master="local[1]", jars_dir=str(REPO_ROOT / ".cdc" / "jars" / "spark")))
    measure(spark, 5, call_sites=False)  # warm-up: classes loaded, functions resolved
    print(f"{'columns':>7}  {'platform (no call sites)':>28}  {'PySpark default (call sites)':>30}  ratio")
    for columns in args.columns:
        floor_s, floor_trips = measure(spark, columns, call_sites=False)
        default_s, default_trips = measure(spark, columns, call_sites=True)
        print(f"{columns:>7}  {floor_s:8.3f} s {floor_trips:8d} trips  {default_s:10.3f} s {default_trips:8d} trips"
              f"  {default_s / floor_s:5.2f}x")  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
