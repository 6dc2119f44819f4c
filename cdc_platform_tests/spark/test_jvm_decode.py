"""The JVM decoder (Spark SQL) and the Python decoder give the same change row for every
record: the platform's envelopes, a Debezium connector's, and malformed ones. Records
Spark SQL cannot decode exactly go to Python; the common ones must not (or the JVM path
would be a stub that the equality hides)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from cdc_platform.envelope.debezium import UNAVAILABLE, ColumnSpec, EnvelopeCodec, SourcePosition, TableShape
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgtypes import PgType, builtin_type
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
from cdc_platform.model.tables import LakeColumn, TableSchema


def t(oid: int) -> PgType:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    return pgtype


NUMERIC_12_2 = (12 << 16 | 2) + 4
NUMERIC_38_4 = (38 << 16 | 4) + 4
COLUMNS = (
    ("id", t(23), -1), ("name", t(1043), 24), ("qty", t(21), -1), ("big", t(20), -1), ("ratio", t(700), -1),
    ("score", t(701), -1), ("flag", t(16), -1), ("born", t(1082), -1), ("seen", t(1114), -1), ("at", t(1184), -1),
    ("price", t(1700), NUMERIC_12_2), ("wide", t(1700), NUMERIC_38_4), ("any", t(1700), -1), ("blob", t(17), -1),
    ("tags", t(1009), -1), ("doc", t(3802), -1), ("clock", t(1083), -1), ("cash", t(790), -1), ("u", t(2950), -1),
)  # fmt: skip
SCHEMA = TableSchema(tuple(LakeColumn(n, p, m) for n, p, m in COLUMNS), ("id",))
SHAPE = TableShape("public", "things", tuple(ColumnSpec(n, p, m, n != "id") for n, p, m in COLUMNS), ("id",), False,
                   "t")  # fmt: skip
ROW = (
    "7", "Anne ✓ \"q\" \\ e", "-32768", "9223372036854775807", "3.5", "0.1", "t", "2024-02-29",
    "1999-12-31 23:59:59.123456", "2024-03-10 02:30:00.5-08", "-1234.50", "12345678901234567890123456789012.3456",
    "-1e-30", "\\x00ff10", '{a,"b c",NULL}', '{"k": [1, 2.50]}', "13:45:07.25", "$1,234.56",
    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
)  # fmt: skip
SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1732530000123,
          "snapshot": "false", "db": "shop", "sequence": '["24023119","24023128"]', "schema": "public",
          "table": "things", "txId": 555, "lsn": 24023128, "xmin": None}  # fmt: skip
PLAIN = {"id": 9, "name": "Bo", "qty": 3, "big": 4, "ratio": 1.5, "score": -2.25, "flag": False, "born": 19000,
         "seen": 1732530000123456, "at": "2026-11-25T10:20:30.123456Z", "price": base64.b64encode(b"\x30\x39").decode(),
         "wide": base64.b64encode((-5).to_bytes(3, "big", signed=True)).decode(), "any": None,
         "blob": base64.b64encode(b"\x01\x02").decode(), "tags": None, "doc": '{"a": 1}', "clock": 3723500000,
         "cash": base64.b64encode((123456).to_bytes(3, "big", signed=True)).decode(), "u": "x-y"}  # fmt: skip


def _platform_records() -> list[tuple[bytes | None, bytes | None]]:
    codec = EnvelopeCodec("shop", "db")
    position = SourcePosition(commit_lsn=900, lsn=850, tx_id=3, commit_time=datetime(2024, 1, 1, tzinfo=UTC))
    toast = tuple("u" if n == "name" else v for (n, _, _), v in zip(COLUMNS, ROW, strict=True))
    plain = tuple(None if n in ("tags", "any", "wide") else v for (n, _, _), v in zip(COLUMNS, ROW, strict=True))
    records = [
        *codec.change_records(SHAPE, "c", plain, None, False, position, 0),  # in the JVM
        *codec.change_records(SHAPE, "c", ROW, None, False, position, 0),  # an array: Python
        *codec.change_records(SHAPE, "u", toast, None, False, position, 0),
        *codec.change_records(SHAPE, "d", None, ROW, False, position, 0),
        *codec.truncate_records(SHAPE, position, 0, 1),
    ]
    return [(r.key, r.value) for r in records]


def _env(payload: dict[str, Any], wrap: bool = False) -> bytes:
    return json.dumps(
        {"schema": {"type": "struct", "optional": False}, "payload": payload} if wrap else payload
    ).encode()


def _key(value: Any, wrap: bool = False) -> bytes:
    return _env({"id": value}, wrap) if not isinstance(value, bytes) else value


def _debezium_records() -> tuple[list[tuple[bytes | None, bytes | None]], int]:
    def change(after: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        return {"before": None, "after": {**PLAIN, **(after or {})}, "source": SOURCE, "op": "c", **fields}

    good = [
        (_key(9), _env(change())),
        (_key(9, True), _env(change(), True)),
        (_key(9), _env(change({"name": UNAVAILABLE, "blob": base64.b64encode(UNAVAILABLE.encode()).decode()}, op="u"))),
        (_key(9), _env(change({"name": None, "qty": None, "at": "infinity", "born": -800000}))),
        (_key(9), _env(change({"at": "-infinity", "seen": -62135596800000000, "wide": None}))),
        (_key(9), _env({"before": {"id": 9}, "after": None, "source": SOURCE, "op": "d"})),
        (_key(9), None),
        (_key(9), _env({"source": {**SOURCE, "sequence": None}, "op": "t"})),
        (_key(9), _env(change({"new_column": 1, "another": "x"}))),
        (None, _env({"before": {"id": 9}, "after": None, "source": {**SOURCE, "txId": None}, "op": "d"})),
        (_key(9), _env(change(source={**SOURCE, "sequence": '[null,"5"]', "lsn": "77"}))),
        (_key(9), _env(change({"seen": 2**62, "score": 1e301}))),  # past Python's datetime: microseconds
        (_key(9), _env(change({"tags": ["a", None]}))),  # a text array: every element a string or null
        (_key(9), _env(change({"tags": []}))),
        (_key(9), _env(change({"tags": ["é ✓", 'quo"te', "back\\slash", "", "NULL", "{}"]}))),
        (_key(9), _env(change({"tags": [UNAVAILABLE]}, op="u"))),  # the TOAST placeholder of an array
    ]
    python_only = [
        (_key(9), _env(change({"qty": 40000}))),  # beyond smallint: Arrow's error row
        (_key(9), _env(change({"qty": "3"}))),  # a string where an integer belongs
        (_key(9), _env(change({"name": 42}))),  # a number where text belongs
        (_key(9), _env(change({"name": {"nested": [1, 2.50]}}))),
        (_key(9), _env(change({"flag": 1}))),
        (_key(9), _env(change({"ratio": "NaN", "score": "Infinity"}))),
        (_key(9), _env(change({"score": float("inf")}))),  # json writes Infinity: Python reads it, JSON does not
        (_key(9), json.dumps(change({"score": 10**400})).encode()),
        (_key(9), _env(change({"born": "19000"}))),
        (_key(9), _env(change({"at": "2024-03-10T02:30:00.5-08:00"}))),
        (_key(9), _env(change({"at": "-4713-11-24T00:00:00Z"}))),
        (_key(9), _env(change({"at": "2026-02-30T00:00:00Z"}))),
        (_key(9), _env(change({"at": "2026-11-25T10:20:30.123456789Z"}))),
        (_key(9), _env(change({"price": "MDk"}))),  # not strict base64
        (_key(9), _env(change({"price": base64.b64encode(b"\x00" * 8 + b"\x01").decode()}))),
        (_key(9), _env(change({"price": {"scale": 2, "value": "MDk="}}))),
        (_key(9), _env(change({"price": 12.5}))),
        (_key(9), _env(change({"any": base64.b64encode(b"\x01").decode()}))),
        (_key(9), _env(change({"tags": '["a"]'}))),  # a string token holding an array's JSON
        (_key(9), _env(change({"tags": ["a", 1]}))),  # Python keeps the number (then str), Spark its text
        (_key(9), _env(change({"tags": ["a", 1.50]}))),
        (_key(9), _env(change({"tags": [["a"], "b"]}))),  # deeper than declared: Python's reason
        (_key(9), _env(change({"tags": ["a", {"k": 1}]}))),
        (_key(9), _env(change({"tags": ""}))),
        (_key(9), _env(change({"tags": UNAVAILABLE}, op="u"))),  # the placeholder as a string token
        (_key(9), _env(change({"clock": "01:00:00"}))),  # a time as text: Python keeps the text
        (_key(9), _env(change({"clock": -1}))),
        (_key(9), _env(change({"blob": "not base64!"}))),
        (_key(9), _env(change({"big": 2**63}))),
        (_key(9), b'{"op": "c", "after": {"id": 1}, "source": {}, "op": "u"}'),  # a repeated field
        # a field repeated inside an image (Python keeps the last): the variant parse refuses it
        (_key(9), _env(change()).replace(b'"after": {"id": 9', b'"after": {"id": 9, "name": "first", "id": 10', 1)),
        (_key(9), b'{"schema": null, "payload": ' + _env(change()) + b"}"),  # Python unwraps it; no op on top
        (_key(9, True), _env(change(), True)[:-1] + b', "payload": ' + _env(change(op="d")) + b"}"),  # payload twice
        (_key(9), _env(change(source={**SOURCE, "sequence": 5}))),  # a number where the sequence's text belongs
        (_key(9), _env(change(source={**SOURCE, "lsn": "\u0663", "txId": "-0"}))),  # Python: int("٣") is 3, "-0" 0
        (_key("9", True), _env(change(), True)),  # a wrapped key's string token where an integer belongs
        (b'{"id": 9, "other": 1}', _env(change())),
        (b'{"schema": {}, "payload": {"id": 9}, "payload": {"id": 10}}', _env(change())),  # Python: the last
        (b'{"schema": null, "payload": {"id": 9}}', _env(change())),  # Python unwraps it
        (_key(9), b"{'op': 'c'}"),
        (_key(9), b"not json"),
        (_key(9), b"[1, 2]"),
        (_key(9), b'{"op": "c", "after": {"id": NaN}, "source": {}}'),
        (_key(9), b"\xff\xfe{}"),
        (_key(9), _env(change(op="x"))),
        (_key(9), _env({"after": PLAIN, "op": "c"})),  # no source block
        (_key(9), _env({"after": None, "before": None, "source": SOURCE, "op": "c"})),
        (None, _env({"before": None, "after": None, "source": SOURCE, "op": "d"})),
        (_key(9), _env({**change(), "after": "not an object"})),
        (_key(9), _env(change(source={**SOURCE, "sequence": '["x"]'}))),
        (_key(9), _env(change(source={**SOURCE, "sequence": "[]"}))),
        (_key(9), _env(change(source={**SOURCE, "sequence": ["1", "2"]}))),
        (_key(9), _env(change(source={**SOURCE, "ts_ms": 1.5}))),
        (_key(9), _env(change(source={**SOURCE, "lsn": 2**64}))),
        (
            _key(9),
            _env(
                {
                    "cdc_unconvertible": {
                        "table": "public.things",
                        "column": "at",
                        "op": "c",
                        "text": "x",
                        "reason": "no",
                    },
                    "source": SOURCE,
                    "op": None,
                },
                False,
            ),
        ),
        (_key("é"), _env(change())),  # a key Python writes with \\u escapes
        (_key(9.5), _env(change())),
        (b'{"id": 9, "id": 10}', _env(change())),
        (b'{"other": 9}', _env(change())),
        (b"not json", _env(change())),
        (b"[9]", None),
        (None, None),
    ]
    return good + python_only, len(good)


ENCODINGS = [
    ValueEncoding(),
    ValueEncoding(decimal="string", time_precision="adaptive", binary="hex"),
    ValueEncoding(binary="base64-url-safe", time_precision="adaptive_time_microseconds"),
]


def _raw(spark: Any, records: list[tuple[bytes | None, bytes | None]]) -> Any:
    rows = [
        (0, offset, datetime(2026, 11, 25, 10, 0, tzinfo=UTC), 0 if offset % 7 else -1, key, value)
        for offset, (key, value) in enumerate(records)
    ]
    schema = "partition int, offset bigint, timestamp timestamp, timestampType int, key binary, value binary"
    return spark.createDataFrame(rows, schema).select(*RAW_COLUMNS)


@pytest.mark.spark_codegen
@pytest.mark.parametrize("encoding", ENCODINGS, ids=["platform", "string-decimals-hex-adaptive", "url-safe"])
def test_every_record_decodes_the_same_in_the_jvm_as_in_python(spark: Any, encoding: ValueEncoding) -> None:
    debezium, good = _debezium_records()
    records = _platform_records() + debezium
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
    python_rows = rows.where("not __jvm").count()
    assert python_decoded(rows, SCHEMA, encoding).count() == python_rows > 10  # only those leave the JVM
    assert by_python.where("error is not null").count() > 10  # the malformed ones are error rows in both
    in_jvm = {r["offset"] for r in _jvm_rows(raw, SCHEMA, encoding).where("__jvm").select("offset").collect()}
    platform = len(_platform_records())
    assert not in_jvm & set(range(platform + good, len(records)))  # malformed or inexpressible: Python
    if encoding == ENCODINGS[0]:  # what a platform or Debezium source writes stays in the JVM
        assert set(range(platform, platform + good)) | {0, 3, 4, 5} <= in_jvm, sorted(in_jvm)


def _as_json(frame: Any, offset: int) -> str:
    from pyspark.sql import functions as F

    return str(frame.where(F.col("kafka_offset") == offset).select(F.to_json(F.struct("*"))).first())


def test_a_batch_held_in_the_driver_has_the_rows_and_statistics_of_the_cached_one(spark: Any) -> None:
    """A small stream batch is collected once and finished in the driver
    (``lake.driver_batch``): its records, counts by kind, dead letters, unknown columns and
    the merge's summary must be those of the cached Spark path (``changelog._decoded``)."""
    from cdc_platform.lake.changelog import _batch_of, _decoded
    from cdc_platform.lake.driver_batch import collected_records, kind_statistics

    debezium, _ = _debezium_records()
    extra = _env({"before": None, "after": {**PLAIN, "added": 1}, "source": SOURCE, "op": "c"})
    records = [*_platform_records(), *debezium, (_key(9), extra)]
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
