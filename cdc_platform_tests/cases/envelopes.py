"""Kafka records of one table (``SCHEMA``, a column per kind the decoders treat apart): the
platform's own envelopes, a Debezium connector's, and records no decoder can read exactly.
Both decoders (Spark SQL's and Python's) must give each the same change row or error row
(``spark/test_jvm_decode.py``), and no record may stop a batch (``unit/test_malformed_records.py``)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from cdc_platform.envelope.debezium import UNAVAILABLE, ColumnSpec, EnvelopeCodec, SourcePosition, TableShape
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgtypes import PgType, builtin_type
from cdc_platform.model.tables import LakeColumn, TableSchema
from cdc_platform_tests.cases.envelope_mutations import deeply_nested

Record = tuple[bytes | None, bytes | None]


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


def platform_records() -> list[tuple[bytes | None, bytes | None]]:
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


def env(payload: dict[str, Any], wrap: bool = False) -> bytes:
    return json.dumps(
        {"schema": {"type": "struct", "optional": False}, "payload": payload} if wrap else payload
    ).encode()


def key(value: Any, wrap: bool = False) -> bytes:
    return env({"id": value}, wrap) if not isinstance(value, bytes) else value


def debezium_records() -> tuple[list[tuple[bytes | None, bytes | None]], int]:
    def change(after: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        return {"before": None, "after": {**PLAIN, **(after or {})}, "source": SOURCE, "op": "c", **fields}

    good = [
        (key(9), env(change())),
        (key(9, True), env(change(), True)),
        (
            key(9),
            env(change({"name": UNAVAILABLE, "blob": base64.b64encode(UNAVAILABLE.encode()).decode()}, op="u")),
        ),
        (key(9), env(change({"name": None, "qty": None, "at": "infinity", "born": -800000}))),
        (key(9), env(change({"at": "-infinity", "seen": -62135596800000000, "wide": None}))),
        (key(9), env({"before": {"id": 9}, "after": None, "source": SOURCE, "op": "d"})),
        (key(9), None),
        (key(9), env({"source": {**SOURCE, "sequence": None}, "op": "t"})),
        (key(9), env(change({"new_column": 1, "another": "x"}))),
        (None, env({"before": {"id": 9}, "after": None, "source": {**SOURCE, "txId": None}, "op": "d"})),
        (key(9), env(change(source={**SOURCE, "sequence": '[null,"5"]', "lsn": "77"}))),
        (key(9), env(change({"seen": 2**62, "score": 1e301}))),  # past Python's datetime: microseconds
        (key(9), env(change({"tags": ["a", None]}))),  # a text array: every element a string or null
        (key(9), env(change({"tags": []}))),
        (key(9), env(change({"tags": ["é ✓", 'quo"te', "back\\slash", "", "NULL", "{}"]}))),
        (key(9), env(change({"tags": [UNAVAILABLE]}, op="u"))),  # the TOAST placeholder of an array
    ]
    good += [  # source.ts_ms outside the years 2 to 9998: source_ts empty, the change kept
        (key(9), env(change(source={**SOURCE, "ts_ms": ts_ms})))
        for ts_ms in (2**62, 2**63 - 1, -(2**63), 253402300800000, -62135596800000, -62104060800001, 253370764800000)
    ]
    # an unknown column 900 levels deep: both parsers read it (Python's gives up near 1 000)
    good.append((key(9), env(change()).replace(b'"op"', b'"deep": ' + deeply_nested(900).encode() + b', "op"')))
    good += [  # and inside them, to the millisecond (a float division lost it past 2242)
        (key(9), env(change(source={**SOURCE, "ts_ms": ts_ms})))
        for ts_ms in (10413792000123, 253370764799999, -62104060800000)
    ]
    good.append((key(9), env(change({"clock": 86_400_000_000}))))  # 24:00:00, PostgreSQL's last time of day
    good += [  # whitespace after the value or the key: JSON for both parsers
        (key(9), env(change()) + b" \n"),
        (b'{"id":9} ', env(change())),
    ]
    # what follows a JSON value: Spark's parser ignores it, Python's refuses it ("Extra data")
    trailing = [b" x", b"]", b"}", b"]}", b',{"a": 1}', b', "x": 1}', b"{}", b" null"]
    python_only = [(key(9), env(change()) + t) for t in trailing]
    python_only += [(key(9, True), env(change(), True) + t) for t in trailing[:3]]
    python_only += [(b'{"id": 9}' + t, env(change())) for t in trailing]
    python_only += [(b'{"id":9}' + t, None) for t in trailing[:3]]  # a tombstone's key, compact
    python_only += [
        (key(9), env(change(source={**SOURCE, "sequence": '["5","6"]' + t}))) for t in (" x", "]", '["7"]', ',"7"]')
    ]
    python_only += [
        (key(9), env(change(source={**SOURCE, "sequence": '[" 5","6"]'}))),  # Spark's cast trims, Python's int too
        (key(9), env(change(source={**SOURCE, "sequence": '["+5","6"]'}))),
        (key(9), env(change({"cash": "Infinity"}))),  # base64 too (six bytes), but Python reads it as infinity
        (key(9), env(change({"clock": 253402300799999999}))),  # a double's hours were one too many
        (key(9), env(change({"clock": 86_400_000_001}))),  # past 24:00:00, no time of day
        (key(9), env(change(op=["c"]))),  # once a crash of the Python decoder: the batch failed
        (key(9), env(change(op={"c": 1}))),
        (key(9), env(change(source={**SOURCE, "sequence": '{"a": 1}'}))),
        (key(9), env(change(source={**SOURCE, "sequence": '[true, "5"]'}))),
        (key(9), env(change(source={**SOURCE, "sequence": "[1.9]"}))),
        (key(9), env(change(source={**SOURCE, "sequence": '["5.0"]'}))),
        (key(9), env(change(source={**SOURCE, "ts_ms": True}))),
        (key(9), env(change(source={**SOURCE, "ts_ms": 1e300}))),
        (key(9), env(change()).replace(b'"op"', b'"deep": ' + deeply_nested(5000).encode() + b', "op"')),
        (b'{"id": ' + deeply_nested(5000).encode() + b"}", env(change())),
        (key(9), env(change({"qty": 40000}))),  # beyond smallint: Arrow's error row
        (key(9), env(change({"qty": "3"}))),  # a string where an integer belongs
        (key(9), env(change({"name": 42}))),  # a number where text belongs
        (key(9), env(change({"name": {"nested": [1, 2.50]}}))),
        (key(9), env(change({"flag": 1}))),
        (key(9), env(change({"ratio": "NaN", "score": "Infinity"}))),
        (key(9), env(change({"score": float("inf")}))),  # json writes Infinity: Python reads it, JSON does not
        (key(9), json.dumps(change({"score": 10**400})).encode()),
        (key(9), env(change({"born": "19000"}))),
        (key(9), env(change({"at": "2024-03-10T02:30:00.5-08:00"}))),
        (key(9), env(change({"at": "-4713-11-24T00:00:00Z"}))),
        (key(9), env(change({"at": "2026-02-30T00:00:00Z"}))),
        (key(9), env(change({"at": "2026-11-25T10:20:30.123456789Z"}))),
        (key(9), env(change({"price": "MDk"}))),  # not strict base64
        (key(9), env(change({"price": base64.b64encode(b"\x00" * 8 + b"\x01").decode()}))),
        (key(9), env(change({"price": {"scale": 2, "value": "MDk="}}))),
        (key(9), env(change({"price": 12.5}))),
        (key(9), env(change({"any": base64.b64encode(b"\x01").decode()}))),
        (key(9), env(change({"tags": '["a"]'}))),  # a string token holding an array's JSON
        (key(9), env(change({"tags": ["a", 1]}))),  # Python keeps the number (then str), Spark its text
        (key(9), env(change({"tags": ["a", 1.50]}))),
        (key(9), env(change({"tags": [["a"], "b"]}))),  # deeper than declared: Python's reason
        (key(9), env(change({"tags": ["a", {"k": 1}]}))),
        (key(9), env(change({"tags": ""}))),
        (key(9), env(change({"tags": UNAVAILABLE}, op="u"))),  # the placeholder as a string token
        (key(9), env(change({"clock": "01:00:00"}))),  # a time as text: Python keeps the text
        (key(9), env(change({"clock": -1}))),
        (key(9), env(change({"blob": "not base64!"}))),
        (key(9), env(change({"big": 2**63}))),
        (key(9), b'{"op": "c", "after": {"id": 1}, "source": {}, "op": "u"}'),  # a repeated field
        # a field repeated inside an image (Python keeps the last): the variant parse refuses it
        (
            key(9),
            env(change()).replace(b'"after": {"id": 9', b'"after": {"id": 9, "name": "first", "id": 10', 1),
        ),
        (key(9), b'{"schema": null, "payload": ' + env(change()) + b"}"),  # Python unwraps it; no op on top
        (
            key(9, True),
            env(change(), True)[:-1] + b', "payload": ' + env(change(op="d")) + b"}",
        ),  # payload twice
        (key(9), env(change(source={**SOURCE, "sequence": 5}))),  # a number where the sequence's text belongs
        (
            key(9),
            env(change(source={**SOURCE, "lsn": "\u0663", "txId": "-0"})),
        ),  # Python: int("٣") is 3, "-0" 0
        (key("9", True), env(change(), True)),  # a wrapped key's string token where an integer belongs
        (b'{"id": 9, "other": 1}', env(change())),
        (b'{"schema": {}, "payload": {"id": 9}, "payload": {"id": 10}}', env(change())),  # Python: the last
        (b'{"schema": null, "payload": {"id": 9}}', env(change())),  # Python unwraps it
        (key(9), b"{'op': 'c'}"),
        (key(9), b"not json"),
        (key(9), b"[1, 2]"),
        (key(9), b'{"op": "c", "after": {"id": NaN}, "source": {}}'),
        (key(9), b"\xff\xfe{}"),
        (key(9), env(change(op="x"))),
        (key(9), env({"after": PLAIN, "op": "c"})),  # no source block
        (key(9), env({"after": None, "before": None, "source": SOURCE, "op": "c"})),
        (None, env({"before": None, "after": None, "source": SOURCE, "op": "d"})),
        (key(9), env({**change(), "after": "not an object"})),
        (key(9), env(change(source={**SOURCE, "sequence": '["x"]'}))),
        (key(9), env(change(source={**SOURCE, "sequence": "[]"}))),
        (key(9), env(change(source={**SOURCE, "sequence": ["1", "2"]}))),
        (key(9), env(change(source={**SOURCE, "ts_ms": 1.5}))),
        (key(9), env(change(source={**SOURCE, "lsn": 2**64}))),
        (
            key(9),
            env(
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
        (key("é"), env(change())),  # a key Python writes with \\u escapes
        (key(9.5), env(change())),
        (b'{"id": 9, "id": 10}', env(change())),
        (b'{"other": 9}', env(change())),
        (b"not json", env(change())),
        (b"[9]", None),
        (None, None),
    ]
    return good + python_only, len(good)


ENCODINGS = [
    ValueEncoding(),
    ValueEncoding(decimal="string", time_precision="adaptive", binary="hex"),
    ValueEncoding(binary="base64-url-safe", time_precision="adaptive_time_microseconds"),
]
