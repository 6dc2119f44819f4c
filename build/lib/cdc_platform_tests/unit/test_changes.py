"""Decoding Kafka records into change rows: ours and a real Debezium connector's."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from cdc_platform.envelope.changes import ChangeDecodeError, LakeColumnSpec, decode_record
from cdc_platform.envelope.debezium import ColumnSpec, EnvelopeCodec, SourcePosition, TableShape
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgoutput import UNCHANGED_TOAST
from cdc_platform.envelope.pgtypes import PgType, builtin_type


def t(oid: int) -> PgType:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    return pgtype


NUMERIC_12_2 = (12 << 16 | 2) + 4

# the table of Debezium's documented PostgreSQL examples
CUSTOMERS = [
    LakeColumnSpec("id", t(23), -1),
    LakeColumnSpec("first_name", t(1043), 259),
    LakeColumnSpec("last_name", t(1043), 259),
    LakeColumnSpec("email", t(1043), 259),
]


def debezium(payload: dict, with_schema: bool = False) -> bytes:  # type: ignore[type-arg]
    return json.dumps({"schema": {"type": "struct"}, "payload": payload} if with_schema else payload).encode()


SOURCE = {
    "version": "2.5.4.Final",
    "connector": "postgresql",
    "name": "PostgreSQL_server",
    "ts_ms": 1559033904863,
    "snapshot": True,
    "db": "postgres",
    "sequence": '["24023119","24023128"]',
    "schema": "public",
    "table": "customers",
    "txId": 555,
    "lsn": 24023128,
    "xmin": None,
}
ANNE = {"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}


@pytest.mark.parametrize("with_schema", [False, True])
def test_debezium_documented_create_update_delete(with_schema: bool) -> None:
    key = debezium({"id": 1}, with_schema)
    create = decode_record(
        key, debezium({"before": None, "after": ANNE, "source": SOURCE, "op": "c"}, with_schema), CUSTOMERS
    )
    assert (create.op, create.after, create.key) == ("c", ANNE, {"id": 1})
    assert (create.commit_lsn, create.lsn, create.tx_id) == (24023119, 24023128, 555)
    assert create.source_ts == datetime(2019, 5, 28, 8, 58, 24, 863000, tzinfo=UTC)
    updated = {**ANNE, "first_name": "Anne Marie"}
    update = decode_record(
        key, debezium({"before": {"id": 1}, "after": updated, "source": SOURCE, "op": "u"}, with_schema), CUSTOMERS
    )
    assert update.op == "u" and update.after == updated
    assert update.before == {"id": 1, "first_name": None, "last_name": None, "email": None}
    delete = decode_record(
        key, debezium({"before": updated, "after": None, "source": SOURCE, "op": "d"}, with_schema), CUSTOMERS
    )
    assert delete.op == "d" and delete.after is None and delete.before == updated
    tombstone = decode_record(key, None, CUSTOMERS)
    assert tombstone.is_tombstone and tombstone.key == {"id": 1}


def test_our_envelope_decodes_to_exact_lake_values() -> None:
    columns = (
        ColumnSpec("id", t(20), -1, False),
        ColumnSpec("price", t(1700), NUMERIC_12_2, True),
        ColumnSpec("big", t(1700), -1, True),
        ColumnSpec("day", t(1082), -1, True),
        ColumnSpec("at", t(1184), -1, True),
        ColumnSpec("naive", t(1114), -1, True),
        ColumnSpec("clock", t(1083), -1, True),
        ColumnSpec("tags", t(1009), -1, True),
        ColumnSpec("blob", t(17), -1, True),
        ColumnSpec("doc", t(3802), -1, True),
    )
    shape = TableShape("public", "x", columns, ("id",), False, "t")
    position = SourcePosition(commit_lsn=900, lsn=850, tx_id=3, commit_time=datetime(2024, 1, 1, tzinfo=UTC))
    new = (
        "7", "-1234.50", "123456789012345678901234567890.000000001", "2024-02-29",
        "2024-03-01 01:00:00.5+02", "1999-12-31 23:59:59.000001", "13:45:07.25", '{a,"b c",NULL}', "\\x00ff",
        '{"k": [1, 2.50]}',
    )  # fmt: skip
    [record] = EnvelopeCodec("shop", "db").change_records(shape, "c", new, None, False, position, 0)
    lake = [LakeColumnSpec(c.name, c.pgtype, c.typmod) for c in columns]
    row = decode_record(record.key, record.value, lake)
    assert row.after == {
        "id": 7,
        "price": Decimal("-1234.50"),
        "big": "123456789012345678901234567890.000000001",  # beyond 38 digits: exact text
        "day": date(2024, 2, 29),
        "at": datetime(2024, 2, 29, 23, 0, 0, 500000, tzinfo=UTC),
        "naive": datetime(1999, 12, 31, 23, 59, 59, 1),
        "clock": "13:45:07.25",
        "tags": ["a", "b c", None],
        "blob": b"\x00\xff",
        "doc": '{"k": [1, 2.50]}',
    }
    assert (row.commit_lsn, row.lsn, row.tx_id) == (900, 850, 3)


def test_unchanged_toast_is_listed_not_null_data() -> None:
    columns = (ColumnSpec("id", t(23), -1, False), ColumnSpec("body", t(25), -1, True))
    shape = TableShape("public", "x", columns, ("id",), False, "t")
    position = SourcePosition(1, 1, 1, datetime(2024, 1, 1, tzinfo=UTC))
    [record] = EnvelopeCodec("s", "d").change_records(shape, "u", ("1", UNCHANGED_TOAST), None, False, position, 0)
    row = decode_record(record.key, record.value, [LakeColumnSpec("id", t(23), -1), LakeColumnSpec("body", t(25), -1)])
    assert row.unavailable == ["body"] and row.after == {"id": 1, "body": None}


def test_truncate_and_string_decimals() -> None:
    row = decode_record(b'{"id":null}', json.dumps({"op": "t", "source": SOURCE}).encode(), CUSTOMERS)
    assert row.op == "t" and row.after is None
    price = [LakeColumnSpec("p", t(1700), NUMERIC_12_2)]
    value = json.dumps({"op": "c", "source": SOURCE, "after": {"p": "1234"}}).encode()
    # "1234" is also valid base64: the source's decimal_handling decides, never the value
    assert decode_record(None, value, price, ValueEncoding(decimal="string")).after == {"p": Decimal("1234")}
    # base64 "1234" = bytes d7 6d f8 = -2658824 unscaled, scale 2
    assert decode_record(None, value, price, ValueEncoding(decimal="precise")).after == {"p": Decimal("-26588.24")}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe not json", "value is not JSON"),
        (b"[1, 2]", "value is not a JSON object"),
        (b'{"op": "x", "source": {}}', "op is 'x'"),
        (b'{"op": "c", "after": {"id": 1}}', "no 'source' block"),
        (json.dumps({"op": "c", "source": SOURCE}).encode(), "op 'c' without 'after'"),
        (
            json.dumps({"op": "c", "source": SOURCE, "after": {"id": "one"}}).encode(),
            "after.id: cannot read 'one' as int4",
        ),
    ],
)
def test_undecodable_records_name_the_reason(value: bytes, reason: str) -> None:
    with pytest.raises(ChangeDecodeError, match=reason):
        decode_record(b'{"id":1}', value, CUSTOMERS)


# one row per Debezium representation setting the lake accepts: (encoding, column type, typmod,
# what Debezium writes, the lake value the platform's capture gives for the same source value)
REPRESENTATION_CASES = [
    (ValueEncoding(time_precision="adaptive"), 1114, 3, 1_700_000_000_123, datetime(2023, 11, 14, 22, 13, 20, 123000)),
    (ValueEncoding(time_precision="adaptive"), 1114, -1, 1_700_000_000_123_456,
     datetime(2023, 11, 14, 22, 13, 20, 123456)),
    (ValueEncoding(time_precision="adaptive"), 1083, 3, 45_296_789, "12:34:56.789"),
    (ValueEncoding(time_precision="adaptive_time_microseconds"), 1083, 3, 45_296_789_000, "12:34:56.789"),
    (ValueEncoding(time_precision="adaptive_time_microseconds"), 1114, 0, 1_700_000_000_000,
     datetime(2023, 11, 14, 22, 13, 20)),
    (ValueEncoding(binary="hex"), 17, -1, "00ff10", b"\x00\xff\x10"),
    (ValueEncoding(binary="base64-url-safe"), 17, -1, "AP8Q_-8", b"\x00\xff\x10\xff\xef"),
    (ValueEncoding(binary="base64"), 17, -1, "AP8Q", b"\x00\xff\x10"),
    (ValueEncoding(decimal="string"), 1700, NUMERIC_12_2, "-26588.24", Decimal("-26588.24")),
]  # fmt: skip


@pytest.mark.parametrize(("encoding", "oid", "typmod", "written", "expected"), REPRESENTATION_CASES)
def test_each_debezium_representation_decodes_to_the_platforms_lake_value(
    encoding: ValueEncoding, oid: int, typmod: int, written: object, expected: object
) -> None:
    column = [LakeColumnSpec("v", t(oid), typmod)]
    value = json.dumps({"op": "c", "source": SOURCE, "after": {"v": written}}).encode()
    assert decode_record(None, value, column, encoding).after == {"v": expected}


def test_an_unavailable_bytea_is_recognised_in_every_binary_mode() -> None:
    column = [LakeColumnSpec("v", t(17), -1)]
    for mode in ("bytes", "base64", "base64-url-safe", "hex"):
        encoding = ValueEncoding(binary=mode)  # type: ignore[arg-type]
        placeholder = encoding.binary_text(b"__debezium_unavailable_value")
        value = json.dumps({"op": "u", "source": SOURCE, "after": {"v": placeholder}}).encode()
        row = decode_record(None, value, column, encoding)
        assert row.unavailable == ["v"], mode
