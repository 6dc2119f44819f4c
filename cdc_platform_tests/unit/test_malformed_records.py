"""No record stops a table's apply: whatever a producer writes, the Python decoder gives a
change row or an error row (a dead letter, kept under ``errors.tolerance``), never an
exception that fails the batch. A failed batch is retried from the same offsets, so one
such record stopped its table for good."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cdc_platform.envelope.changes import ChangeDecodeError, decode_record
from cdc_platform_tests.cases.envelope_mutations import deeply_nested, mutated_records
from cdc_platform_tests.cases.envelopes import (
    ENCODINGS,
    PLAIN,
    SCHEMA,
    SOURCE,
    debezium_records,
    env,
    key,
    platform_records,
)


def _decoded(
    records: list[tuple[bytes | None, bytes | None]],
    encoding_index: int = 0,
    columns: tuple[str, ...] = (),
    kafka_micros: int = 1_764_892_800_000_000,
) -> list[dict[str, Any]]:
    """The records through the Python decoder as the stream apply runs it (Arrow batches in,
    change rows out), one row per record; ``columns`` only, when given (an instant past
    year 9999 has a lake value and no Python one). ``kafka_micros``: every record's Kafka
    timestamp, as Spark's Kafka source hands it over."""
    import pyarrow as pa

    from cdc_platform.lake.kafka_source import change_schema, decode_mixed_batches
    from cdc_platform.lake.lake_types import row_type

    n = len(records)
    raw = pa.RecordBatch.from_arrays(
        [
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([kafka_micros] * n, pa.timestamp("us", tz="UTC")),
            pa.array([0] * n, pa.int32()),
            pa.array([k for k, _ in records], pa.binary()),
            pa.array([v for _, v in records], pa.binary()),
        ],
        names=["partition", "offset", "timestamp", "timestampType", "key", "value"],
    )
    out = change_schema(row_type(SCHEMA)).json()
    batches = decode_mixed_batches(iter([raw]), SCHEMA.to_json(), ENCODINGS[encoding_index].to_option(), out)
    return [row for batch in batches for row in (batch.select(columns) if columns else batch).to_pylist()]


def _change(**fields: Any) -> dict[str, Any]:
    return {"before": None, "after": PLAIN, "source": SOURCE, "op": "c", **fields}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (env(_change(op=["c"])), r"op is \['c'\]"),
        (env(_change(op={"c": 1})), r"op is \{'c': 1\}"),
        (env(_change(source={**SOURCE, "sequence": '{"a": 1}'})), "source.sequence"),
        (env(_change(source={**SOURCE, "sequence": '"5"'})), "source.sequence"),
        (env(_change(source={**SOURCE, "sequence": '[true, "5"]'})), "source.sequence"),
        (env(_change(source={**SOURCE, "sequence": "[1.9]"})), "source.sequence"),
        (env(_change()).replace(b'"op"', b'"deep": ' + deeply_nested(5000).encode() + b', "op"'), "nested"),
    ],
)
def test_a_malformed_envelope_is_an_error_row_naming_what_is_wrong(value: bytes, reason: str) -> None:
    with pytest.raises(ChangeDecodeError, match=reason):
        decode_record(key(9), value, [])
    (row,) = _decoded([(key(9), value)])
    assert row["error"] is not None and row["raw_value"] == value


@pytest.mark.parametrize(
    "numeric",
    [
        {"scale": 86_400_000_000, "value": "/w=="},  # once a MemoryError: 86 billion digits after the point
        {"scale": -200_000, "value": "AQ=="},  # 200 000 zeros before it
        "1e999999999",
        "1e-20000",
    ],
)
def test_a_numeric_beyond_postgresqls_is_an_error_row(numeric: Any) -> None:
    """PostgreSQL's numeric holds 131 072 digits before the point and 16 383 after: a value
    past either is a broken producer's, and writing it out as text would take the worker's
    memory (or its time) before failing."""
    encoding = 0 if isinstance(numeric, dict) else 1  # "1e…" as text: decimal.handling.mode=string
    (row,) = _decoded([(key(9), env(_change(after={"id": 9, "any": numeric})))], encoding, ("error",))
    assert row["error"] is not None and "after.any" in row["error"] and "PostgreSQL" in row["error"]


def test_a_key_nested_too_deep_is_an_error_row() -> None:
    nested = b'{"id": ' + deeply_nested(5000).encode() + b"}"
    (row,) = _decoded([(nested, env(_change()))])
    assert row["error"].startswith("key is not JSON: nested too deeply to read")


@pytest.mark.parametrize(
    "ts_ms", [2**62, 2**63 - 1, -(2**63), 253402300800000, -62135596800000, -62104060800001, 1e300, True]
)
def test_a_source_time_no_instant_can_hold_keeps_the_change_without_it(ts_ms: Any) -> None:
    """``source.ts_ms`` is when the source committed: metadata, not the row. One outside the
    years 2 to 9998 (or a boolean) leaves ``source_ts`` empty, as a non-number does; the
    change is kept."""
    (row,) = _decoded([(key(9), env(_change(source={**SOURCE, "ts_ms": ts_ms})))])
    assert row["error"] is None and row["op"] == "c" and row["after"]["id"] == 9
    assert row["source_ts"] is None


def test_a_source_time_is_exact_to_the_millisecond_in_any_year() -> None:
    # a float division lost it past ~2^33 s: 2300-01-01 00:00:00.123 came out .122999 or .123001
    for ms in (10413792000123, 253370764799999, -62104060800000, 1732530000123):
        (row,) = _decoded([(key(9), env(_change(source={**SOURCE, "ts_ms": ms})))])
        assert row["source_ts"] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@pytest.mark.parametrize("ms", [253402300800000, 9_000_000_000_000_000, -62135596800001])
def test_a_kafka_timestamp_no_instant_can_hold_keeps_the_change_without_it(ms: int) -> None:
    """A record's Kafka timestamp is the producer's (CreateTime) unless the topic says
    otherwise, and brokers before Kafka 4 accept any. One outside the years 2 to 9998 leaves
    ``kafka_timestamp`` empty, in the JVM too; the change, or its dead letter, is kept."""
    change, dead_letter = _decoded([(key(9), env(_change())), (key(9), b"not json")], kafka_micros=ms * 1000)
    assert (change["op"], change["error"], change["after"]["id"]) == ("c", None, 9)
    assert dead_letter["error"] is not None and dead_letter["raw_value"] == b"not json"
    assert change["kafka_timestamp"] is None and dead_letter["kafka_timestamp"] is None


def test_a_kafka_timestamp_is_exact_to_the_millisecond_in_any_year() -> None:
    for ms in (10413792000123, 253370764799999, -62104060800000, 1732530000123):
        (row,) = _decoded([(key(9), env(_change()))], kafka_micros=ms * 1000)
        assert row["kafka_timestamp"] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@pytest.mark.parametrize("encoding_index", range(len(ENCODINGS)))
def test_no_mutated_record_stops_the_decoder(encoding_index: int) -> None:
    """3 000 records a broken producer could write (values replaced by edge tokens, removed,
    added; fixed seed): one row each, a change row or an error row."""
    debezium, _ = debezium_records()
    records = mutated_records(platform_records() + debezium, 3000, seed=20261205 + encoding_index)
    rows = _decoded(records, encoding_index, ("kafka_offset", "error"))
    assert [r["kafka_offset"] for r in rows] == list(range(len(records)))
    errors = sum(r["error"] is not None for r in rows)
    assert 0 < errors < len(records)  # the mutations make both kinds


def test_the_mutations_are_json_a_producer_could_write() -> None:
    debezium, _ = debezium_records()
    records = mutated_records(platform_records() + debezium, 200, seed=1)
    assert len({v for _, v in records}) > 150  # varied, not one record repeated
    for _, value in records:
        assert value is not None
        json.loads(value)
