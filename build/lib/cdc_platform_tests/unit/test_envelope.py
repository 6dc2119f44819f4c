"""Pure envelope logic: pgoutput decoding, conversions, keys, partitioning, acknowledgements."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from confluent_kafka import KafkaError

from cdc_platform.envelope import pgoutput
from cdc_platform.envelope.debezium import UNAVAILABLE, ColumnSpec, EnvelopeCodec, SourcePosition, TableShape
from cdc_platform.envelope.lsn import format_lsn, parse_lsn
from cdc_platform.envelope.partitioner import murmur2, partition_for
from cdc_platform.envelope.pgtypes import (
    ConversionOptions,
    PgType,
    builtin_type,
    bytes_to_decimal,
    decimal_to_bytes,
    interval_micros,
    parse_array,
    to_json_value,
)
from cdc_platform.model.errors import FatalError, RetriableError
from cdc_platform.sources.postgres.stream import AckTracker, delivery_error

# -- partitioner ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's own UtilsTest.testMurmur2 vectors (Java signed ints)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafkas_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected & 0xFFFFFFFF


def test_partition_is_positive_modulo() -> None:
    assert all(0 <= partition_for(f"k{i}".encode(), 3) < 3 for i in range(100))
    assert partition_for(b"21", 4) == (-973932308 & 0x7FFFFFFF) % 4


# -- lsn, decimals, arrays, time ---------------------------------------------------------------


def test_lsn_round_trip() -> None:
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_lsn(parse_lsn("0/3027D68")) == "0/3027D68"
    with pytest.raises(ValueError, match="not an LSN"):
        parse_lsn("3027D68")


@pytest.mark.parametrize(
    ("unscaled", "b64"),  # Java BigInteger.toByteArray(), base64-encoded
    [(0, "AA=="), (127, "fw=="), (128, "AIA="), (-1, "/w=="), (-128, "gA=="), (-129, "/38="), (12345, "MDk=")],
)
def test_decimal_bytes_like_java_biginteger(unscaled: int, b64: str) -> None:
    assert base64.b64encode(decimal_to_bytes(unscaled)).decode() == b64


NUMERIC = builtin_type(1700)
assert NUMERIC is not None


def test_numeric_is_exact() -> None:
    typmod = (38 << 16 | 9) + 4  # numeric(38,9)
    value = "12345678901234567890123456789.123456789"
    encoded = to_json_value(value, NUMERIC, typmod, ConversionOptions())
    assert bytes_to_decimal(base64.b64decode(encoded), 9) == Decimal(value)
    assert str(bytes_to_decimal(base64.b64decode(encoded), 9)) == value
    long_value = "-" + "9" * 60 + "." + "1" * 40  # unconstrained numeric: any precision
    variable = to_json_value(long_value, NUMERIC, -1, ConversionOptions())
    assert variable["scale"] == 40
    assert str(bytes_to_decimal(base64.b64decode(variable["value"]), 40)) == long_value
    assert to_json_value("1.50", NUMERIC, -1, ConversionOptions("string")) == "1.50"
    assert to_json_value("NaN", NUMERIC, typmod, ConversionOptions()) == "NaN"


def test_array_literals() -> None:
    assert parse_array("{}") == []
    assert parse_array('{a,"b c",NULL,"NULL","q\\"uote","back\\\\slash"}') == [
        "a",
        "b c",
        None,
        "NULL",
        'q"uote',
        "back\\slash",
    ]
    assert parse_array("{{1,2},{3,4}}") == [["1", "2"], ["3", "4"]]
    assert parse_array("[0:1]={7,8}") == ["7", "8"]
    int_array = builtin_type(1007)
    assert int_array is not None
    assert to_json_value("{1,NULL,3}", int_array, -1, ConversionOptions()) == [1, None, 3]


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (1184, "2024-02-29 23:59:59.5+00", "2024-02-29T23:59:59.5Z"),
        (1184, "2024-03-01 01:00:00+02", "2024-02-29T23:00:00Z"),
        (1184, "1969-12-31 23:59:59.999999+00", "1969-12-31T23:59:59.999999Z"),
        (1114, "1970-01-01 00:00:01.25", 1_250_000),
        (1082, "2000-01-01", 10957),
        (1082, "infinity", 2**31 - 1),
        (1083, "13:45:07.000123", (13 * 3600 + 45 * 60 + 7) * 1_000_000 + 123),
        (1266, "10:00:00+05:30", "04:30:00Z"),
        (16, "t", True),
        (17, "\\x00ff", "AP8="),
        (701, "0.1", 0.1),
        (701, "NaN", "NaN"),
        (20, "-9223372036854775808", -(2**63)),
        (790, "$1,234.56", "AeJA"),
    ],
)
def test_value_conversions(oid: int, text: str, expected: object) -> None:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    assert to_json_value(text, pgtype, -1, ConversionOptions()) == expected


def test_interval_modes() -> None:
    interval = builtin_type(1186)
    assert interval is not None
    assert to_json_value("P1Y2M3DT4H5M6.5S", interval, -1, ConversionOptions()) == "P1Y2M3DT4H5M6.5S"
    assert interval_micros("P1DT1S") == 86_401_000_000
    assert interval_micros("P1M") == int(30.4375 * 86_400 * 1_000_000)


# -- pgoutput ----------------------------------------------------------------------------------


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(*values: str | pgoutput.UnchangedToast | None) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif isinstance(v, pgoutput.UnchangedToast):
            out += b"u"
        else:
            out += b"t" + struct.pack("!i", len(v.encode())) + v.encode()
    return out


def test_pgoutput_messages() -> None:
    micros = 789_000_000
    begin = pgoutput.decode(b"B" + struct.pack("!QqI", 0x1_0000_0010, micros, 42))
    assert begin == pgoutput.Begin(0x1_0000_0010, datetime(2000, 1, 1, 0, 13, 9, tzinfo=UTC), 42)
    commit = pgoutput.decode(b"C" + struct.pack("!bQQq", 0, 100, 120, micros))
    assert isinstance(commit, pgoutput.Commit) and commit.end_lsn == 120
    relation = pgoutput.decode(
        b"R"
        + struct.pack("!I", 16384)
        + _s("public")
        + _s("t")
        + b"d"
        + struct.pack("!h", 2)
        + b"\x01"
        + _s("id")
        + struct.pack("!Ii", 23, -1)
        + b"\x00"
        + _s("v")
        + struct.pack("!Ii", 25, -1)
    )
    assert isinstance(relation, pgoutput.Relation)
    assert [(c.name, c.part_of_key) for c in relation.columns] == [("id", True), ("v", False)]
    insert = pgoutput.decode(b"I" + struct.pack("!I", 16384) + b"N" + _tuple("1", None))
    assert insert == pgoutput.Insert(16384, ("1", None))
    update = pgoutput.decode(
        b"U" + struct.pack("!I", 16384) + b"K" + _tuple("1", None) + b"N" + _tuple("2", pgoutput.UNCHANGED_TOAST)
    )
    assert update == pgoutput.Update(16384, ("1", None), "K", ("2", pgoutput.UNCHANGED_TOAST))
    delete = pgoutput.decode(b"D" + struct.pack("!I", 16384) + b"O" + _tuple("1", "x"))
    assert delete == pgoutput.Delete(16384, ("1", "x"), "O")
    truncate = pgoutput.decode(b"T" + struct.pack("!ib", 2, 1) + struct.pack("!II", 16384, 16390))
    assert truncate == pgoutput.Truncate(1, (16384, 16390))
    with pytest.raises(pgoutput.PgOutputError, match="truncated"):
        pgoutput.decode(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t\0\0\0\x09ab")


# -- the envelope --------------------------------------------------------------------------------

INT4, TEXT = builtin_type(23), builtin_type(25)
assert INT4 is not None and TEXT is not None


def _shape(full: bool = False) -> TableShape:
    return TableShape(
        schema="public",
        table="items",
        columns=(ColumnSpec("id", INT4, -1, False), ColumnSpec("body", TEXT, -1, True)),
        key_columns=("id",),
        full_identity=full,
        topic="shop.public.items",
    )


POS = SourcePosition(commit_lsn=200, lsn=150, tx_id=7, commit_time=datetime(2024, 1, 1, tzinfo=UTC))


def _values(records: list) -> list[dict | None]:  # type: ignore[type-arg]
    return [json.loads(r.value) if r.value else None for r in records]


def test_insert_update_delete_envelopes_and_stable_keys() -> None:
    codec = EnvelopeCodec("shop", "shopdb")
    shape = _shape()
    [c] = codec.change_records(shape, "c", ("1", "a"), None, False, POS, 5_000_000)
    [u] = codec.change_records(shape, "u", ("1", "b"), None, False, POS, 5_000_000)
    d, tomb = codec.change_records(shape, "d", None, ("1", None), False, POS, 5_000_000)
    assert c.key == u.key == d.key == tomb.key == b'{"id":1}'
    assert tomb.value is None and tomb.op is None
    cv, uv, dv = _values([c, u, d])
    assert cv is not None and uv is not None and dv is not None
    assert (cv["op"], cv["before"], cv["after"]) == ("c", None, {"id": 1, "body": "a"})
    assert (uv["op"], uv["before"], uv["after"]) == ("u", None, {"id": 1, "body": "b"})
    assert (dv["op"], dv["before"], dv["after"]) == ("d", {"id": 1, "body": None}, None)
    source = cv["source"]
    assert source["connector"] == "postgresql" and source["name"] == "shop" and source["db"] == "shopdb"
    assert (source["schema"], source["table"], source["txId"], source["lsn"]) == ("public", "items", 7, 150)
    assert source["sequence"] == '["200","150"]'
    assert source["ts_ms"] == 1704067200000 and source["snapshot"] == "false"
    assert cv["ts_ms"] == 5000


def test_primary_key_update_is_delete_tombstone_create() -> None:
    codec = EnvelopeCodec("shop", "shopdb")
    records = codec.change_records(_shape(), "u", ("2", "a"), ("1", None), False, POS, 0)
    assert [(r.op, r.key) for r in records] == [("d", b'{"id":1}'), (None, b'{"id":1}'), ("c", b'{"id":2}')]


def test_unchanged_toast_placeholder_or_filled_from_full_old_row() -> None:
    codec = EnvelopeCodec("shop", "shopdb")
    toast = pgoutput.UNCHANGED_TOAST
    [default] = codec.change_records(_shape(), "u", ("1", toast), None, False, POS, 0)
    assert json.loads(default.value or b"")["after"]["body"] == UNAVAILABLE
    [full] = codec.change_records(_shape(full=True), "u", ("1", toast), ("1", "long text"), True, POS, 0)
    value = json.loads(full.value or b"")
    assert value["after"]["body"] == "long text" and value["before"]["body"] == "long text"


def test_truncate_goes_to_every_partition_with_a_null_key_row() -> None:
    records = EnvelopeCodec("shop", "db").truncate_records(_shape(), POS, 0, partitions=3)
    key = b'{"id":null}'  # compacted topics need a key; no real row has a null key
    assert [(r.partition, r.key, r.op) for r in records] == [(0, key, "t"), (1, key, "t"), (2, key, "t")]


def test_with_schema_envelope_is_connect_json() -> None:
    codec = EnvelopeCodec("shop", "db", with_schema=True)
    [c] = codec.change_records(_shape(), "c", ("1", "a"), None, False, POS, 0)
    key = json.loads(c.key or b"")
    assert key["payload"] == {"id": 1}
    assert key["schema"]["name"] == "shop.public.items.Key"
    assert key["schema"]["fields"] == [{"type": "int32", "optional": False, "field": "id"}]
    value = json.loads(c.value or b"")
    assert value["schema"]["name"] == "shop.public.items.Envelope"
    assert [f["field"] for f in value["schema"]["fields"]][:5] == ["before", "after", "source", "transaction", "op"]
    assert value["payload"]["after"] == {"id": 1, "body": "a"}


def test_enum_schema_lists_allowed_values() -> None:
    codec = EnvelopeCodec("shop", "db", with_schema=True)
    status = PgType(99999, "order_status", "enum", enum_values=("pending", "paid"))
    columns = (ColumnSpec("id", INT4, -1, False), ColumnSpec("s", status, -1, True))
    shape = TableShape("public", "o", columns, ("id",), False, "t")
    [c] = codec.change_records(shape, "c", ("1", "paid"), None, False, POS, 0)
    fields = json.loads(c.value or b"")["schema"]["fields"][1]["fields"]
    assert fields[1]["name"] == "io.debezium.data.Enum" and fields[1]["parameters"] == {"allowed": "pending,paid"}


# -- acknowledgements ---------------------------------------------------------------------------


def test_ack_tracker_confirms_only_fully_acknowledged_prefixes() -> None:
    now = datetime.now(UTC)
    tracker = AckTracker(confirmed=10)
    t1, t2 = tracker.begin(100, 1, now), tracker.begin(200, 2, now)
    tracker.sent(t1)
    tracker.sent(t2)
    tracker.commit(t1, 110)
    tracker.commit(t2, 210)
    tracker.acked(t2, None)  # the later transaction is acknowledged first
    assert tracker.advance() == 10  # …but t1 is not: nothing moves
    tracker.acked(t1, None)
    assert tracker.advance() == 210
    assert tracker.idle_advance(500) == 500  # idle: the server's position is safe


def test_ack_tracker_never_skips_an_open_or_failed_transaction() -> None:
    now = datetime.now(UTC)
    tracker = AckTracker(confirmed=0)
    open_txn = tracker.begin(100, 1, now)
    assert tracker.idle_advance(999) == 0  # a transaction is open: no heartbeat advance
    tracker.sent(open_txn)
    tracker.commit(open_txn, 110)
    tracker.acked(open_txn, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS))
    with pytest.raises(RetriableError, match=r"was not acknowledged.*resuming from the confirmed position"):
        tracker.advance()


def test_permanent_broker_rejections_are_fatal_with_the_fix() -> None:
    error = delivery_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), 7, 100)
    assert isinstance(error, FatalError)
    assert "max.message.bytes" in str(error) and "restarting after the fix loses nothing" in str(error)
    assert isinstance(delivery_error(KafkaError(KafkaError._MSG_TIMED_OUT), 7, 100), RetriableError)
