"""The JVM decoder (Spark SQL) and the Python decoder give the same change row for every
record: the platform's envelopes, a Debezium connector's, and malformed ones. Records
Spark SQL cannot decode exactly go to Python; the common ones must not (or the JVM path
would be a stub that the equality hides)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.lake.jvm_decode import (
    RAW_COLUMNS,
    _jvm_rows,
    _python_decoder,
    decode_raw,
    exact_rows,
    jvm_decoded,
    python_decoded,
)
from cdc_platform.lake.kafka_source import change_schema
from cdc_platform.lake.lake_types import row_type
from cdc_platform_tests.cases.envelope_mutations import mutated_records
from cdc_platform_tests.cases.envelopes import (
    ENCODINGS,
    PLAIN,
    SCHEMA,
    SOURCE,
    Record,
    debezium_records,
    env,
    key,
    platform_records,
)

# Kafka timestamps (ms) the records take in turn: a usual one, then ones a producer's clock or
# a broker before Kafka 4 lets through (past year 9999, before year 1: no Python instant)
KAFKA_MILLIS = (1764064800000, 253402300800000, 10413792000123, 9_000_000_000_000_000, -62135596800001)


def _raw(spark: Any, records: list[Record]) -> Any:
    from pyspark.sql import functions as F

    rows = [
        (0, offset, KAFKA_MILLIS[offset % len(KAFKA_MILLIS)], 0 if offset % 7 else -1, key, value)
        for offset, (key, value) in enumerate(records)
    ]
    schema = "partition int, offset bigint, millis bigint, timestampType int, key binary, value binary"
    raw = spark.createDataFrame(rows, schema).withColumn("timestamp", F.timestamp_millis("millis"))
    return raw.select(*RAW_COLUMNS)


def _decoded_both_ways(spark: Any, records: list[Record], encoding: ValueEncoding) -> tuple[Any, Any, Any]:
    """The raw records, the JVM decoder's rows (``jvm_decoded``, cached) and the Python decoder's rows of
    every record, after checking that the stream apply's two ways of mixing them give the
    Python decoder's rows, record for record."""
    raw = _raw(spark, records)
    out_schema = change_schema(row_type(SCHEMA))
    everything_in_python = _python_decoder(SCHEMA.to_json(), encoding.to_option(), out_schema.json())
    by_python = raw.mapInArrow(everything_in_python, out_schema)  # no __jvm column: every record decoded in Python
    rows = jvm_decoded(raw, SCHEMA, encoding).cache()
    # the stream apply's way: Spark SQL's exact rows as they are, only the others through Python
    split = exact_rows(rows, SCHEMA).unionByName(python_decoded(rows, SCHEMA, encoding))
    for mixed in (decode_raw(raw, SCHEMA, encoding), split):  # one Arrow hop for all, and the split
        # compared in Spark: BC dates and the extreme instants have no Python value
        assert mixed.count() == by_python.count() == len(records)
        both = mixed.exceptAll(by_python).union(by_python.exceptAll(mixed))
        differ = sorted({r["kafka_offset"] for r in both.select("kafka_offset").collect()})
        assert not differ, [(o, records[o], _as_json(mixed, o), _as_json(by_python, o)) for o in differ[:3]]
    return raw, rows, by_python


@pytest.mark.spark_codegen
@pytest.mark.parametrize("encoding", ENCODINGS, ids=["platform", "string-decimals-hex-adaptive", "url-safe"])
def test_every_record_decodes_the_same_in_the_jvm_as_in_python(spark: Any, encoding: ValueEncoding) -> None:
    debezium, good = debezium_records()
    records = platform_records() + debezium
    raw, rows, by_python = _decoded_both_ways(spark, records, encoding)
    python_rows = rows.where("not __jvm").count()
    assert python_decoded(rows, SCHEMA, encoding).count() == python_rows > 10  # only those leave the JVM
    assert by_python.where("error is not null").count() > 10  # the malformed ones are error rows in both
    in_jvm = {r["offset"] for r in _jvm_rows(raw, SCHEMA, encoding).where("__jvm").select("offset").collect()}
    platform = len(platform_records())
    wrongly_in_jvm = sorted(in_jvm & set(range(platform + good, len(records))))
    assert not wrongly_in_jvm, [records[o] for o in wrongly_in_jvm[:3]]  # malformed or inexpressible: Python
    if encoding == ENCODINGS[0]:  # what a platform or Debezium source writes stays in the JVM
        assert set(range(platform, platform + good)) | {0, 3, 4, 5} <= in_jvm, sorted(in_jvm)


@pytest.mark.spark_codegen
@pytest.mark.parametrize("encoding", ENCODINGS, ids=["platform", "string-decimals-hex-adaptive", "url-safe"])
def test_mutated_records_decode_the_same_in_the_jvm_as_in_python(spark: Any, encoding: ValueEncoding) -> None:
    """2 000 records a broken producer could write (``cases.envelope_mutations``, fixed
    seed): each gives the same row, or the same error row, either way; none fails the batch."""
    debezium, good = debezium_records()  # records the JVM decodes, one value changed: its checks are under test
    records = mutated_records(platform_records() + debezium[:good], 2000, seed=ENCODINGS.index(encoding), most=1)
    _, rows, by_python = _decoded_both_ways(spark, records, encoding)
    assert 0 < by_python.where("error is not null").count() < len(records)
    assert rows.where("__jvm").count() > 100  # not all sent to Python


def _as_json(frame: Any, offset: int) -> str:
    from pyspark.sql import functions as F

    return str(frame.where(F.col("kafka_offset") == offset).select(F.to_json(F.struct("*"))).first())


def test_a_batch_held_in_the_driver_has_the_rows_and_statistics_of_the_cached_one(spark: Any) -> None:
    """A small stream batch is collected once and finished in the driver
    (``lake.driver_batch``): its records, counts by kind, dead letters, unknown columns and
    the merge's summary must be those of the cached Spark path (``changelog._decoded``)."""
    from cdc_platform.lake.changelog import _batch_of, _decoded
    from cdc_platform.lake.driver_batch import collected_records, kind_statistics

    debezium, _ = debezium_records()
    extra = env({"before": None, "after": {**PLAIN, "added": 1}, "source": SOURCE, "op": "c"})
    records = [*platform_records(), *debezium, (key(9), extra)]
    encoding = ENCODINGS[0]
    raw = _raw(spark, records)
    rows = jvm_decoded(raw, SCHEMA, encoding).cache()
    cached = _decoded(exact_rows(rows, SCHEMA).unionByName(python_decoded(rows, SCHEMA, encoding)))
    held, python_rows = collected_records(jvm_decoded(raw, SCHEMA, encoding), SCHEMA, encoding)
    in_driver = _batch_of(cached.frame, kind_statistics(held), python_rows)

    assert python_rows == rows.where("not __jvm").count() > 10
    assert in_driver.events == cached.events and {"c", "u", "d", "t", "tombstone"} <= set(in_driver.events)
    assert in_driver.dead_letters == cached.dead_letters > 10
    assert in_driver.unknown_columns == cached.unknown_columns and "added" in in_driver.unknown_columns
    assert in_driver.summary == cached.summary and in_driver.summary.truncate is not None
    # the same rows (compared in Spark: BC dates and the extreme instants have no Python value)
    back = spark.createDataFrame(held, schema=cached.frame.schema)
    assert back.count() == cached.frame.count() == len(records)
    both = back.exceptAll(cached.frame).union(cached.frame.exceptAll(back))
    assert both.count() == 0, both.limit(3).collect()
