"""Kafka records decoded in the JVM: Spark's own Kafka source, ``from_json`` with a schema
derived from the table, and Spark SQL for each value's conversion.

The rule is exactness, not coverage. Each record is decoded in Spark SQL only when Spark
SQL gives exactly the row the Python decoder (``cdc_platform.envelope.changes``) gives for
it; every other record (a value Spark SQL cannot express exactly, anything malformed, a
tombstone whose key is not plain, capture's unconvertible events) goes to that Python
decoder, in Arrow batches (``mapInArrow``), and comes out identical, error rows included.
``cdc_platform_tests/spark/test_jvm_decode.py`` holds both paths to the same rows.

What Spark SQL decodes here: the envelope (with or without Connect's ``schema`` part),
positions, the key text, and columns of kind int16/32/64, float32/64, bool, date,
timestamp, timestamptz (ISO instants in UTC, ±infinity), numeric/money (precise bytes up to
7 bytes, or decimal text), bytea (base64 or hex), text-like kinds, and the unavailable
(TOAST) placeholder. Python decodes: arrays, time/timetz as integers, numeric beyond those,
and anything unusual. Where a JSON value's token matters (``"5"`` is not ``5`` for an
integer column) the typed parse marks the record corrupt; for text columns, where Spark
would silently take a number's text, a pattern over the raw value sends records with a
non-string token to Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc_platform.envelope.debezium import UNAVAILABLE
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgtypes import INT64_MAX, INT64_MIN, numeric_precision_scale
from cdc_platform.lake.lake_types import MAX_SPARK_DECIMAL_PRECISION, lake_type, row_type
from cdc_platform.model.tables import LakeColumn, TableSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

RAW_COLUMNS = ("partition", "offset", "timestamp", "timestampType", "key", "value")
INT_RANGES = {"int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1), "int64": (INT64_MIN, INT64_MAX)}
MAX_JVM_DECIMAL_BYTES = 7  # unscaled values up to 56 bits: conv() and bigint arithmetic stay exact
CORRUPT = "__corrupt"
JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": CORRUPT,
    # what Python's json module refuses, Spark must not accept either: such records go to Python
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
    "allowUnquotedControlChars": "false",
}
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_HEX = r"^(?:[0-9a-fA-F]{2})*$"
# the ISO instants Spark parses exactly as Python does: 4-digit years from 0001, UTC, µs at most
_UTC_INSTANT = r"^(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?Z$"
_DECIMAL_TEXT = r"^-?[0-9]+(?:\.[0-9]+)?$"
_PLAIN_KEY_TEXT = r"^[ -\[\]-~]*$"  # printable ASCII without backslash: Python and Spark write it alike


@dataclass(frozen=True)
class ColumnDecoding:
    """A column's value in the JVM: the lake value, and when Python must decode the record instead."""

    value: Column
    needs_python: Column
    unavailable: Column


def kafka_source_options(bootstrap_servers: str, topic: str, spans: list[tuple[int, int, int]]) -> dict[str, str]:
    """Spark's Kafka source reading exactly ``[start, end)`` of each partition."""
    spans = [(p, s, e) for p, s, e in spans if e > s]
    return {
        "kafka.bootstrap.servers": bootstrap_servers,
        "assign": json.dumps({topic: [p for p, _, _ in spans]}),
        "startingOffsets": json.dumps({topic: {str(p): s for p, s, _ in spans}}),
        "endingOffsets": json.dumps({topic: {str(p): e for p, _, e in spans}}),
        # compaction and transaction markers leave offsets without records inside a range (as
        # the Python reader, skip them); offsets retention deleted are found before a batch is
        # planned, from the topic's earliest offsets (model/rehydration.changelog_gap)
        "failOnDataLoss": "false",
        "includeHeaders": "false",
    }


def read_raw(spark: SparkSession, bootstrap_servers: str, topic: str, spans: list[tuple[int, int, int]]) -> DataFrame:
    """The records of the spans as Spark's Kafka source gives them (``RAW_COLUMNS``)."""
    if not any(e > s for _, s, e in spans):
        from pyspark.sql import types as T

        empty = T.StructType(
            [
                T.StructField("partition", T.IntegerType()),
                T.StructField("offset", T.LongType()),
                T.StructField("timestamp", T.TimestampType()),
                T.StructField("timestampType", T.IntegerType()),
                T.StructField("key", T.BinaryType()),
                T.StructField("value", T.BinaryType()),
            ]
        )
        return spark.createDataFrame([], empty)
    options = kafka_source_options(bootstrap_servers, topic, spans)
    return spark.read.format("kafka").options(**options).load().select(*RAW_COLUMNS)


def decode_raw(raw: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """Change rows (``kafka_source.change_schema``) of raw Kafka records: decoded in Spark
    SQL where that is exact, by the Python decoder otherwise."""
    from pyspark.sql import functions as F

    from cdc_platform.lake.kafka_source import change_schema

    out_schema = change_schema(row_type(schema))
    jvm = _jvm_rows(raw, schema, encoding)
    in_jvm = jvm.where(F.col("__jvm")).select(*out_schema.names)
    by_python = (
        jvm.where(~F.col("__jvm"))
        .select(*RAW_COLUMNS)
        .mapInArrow(_python_decoder(schema.to_json(), encoding.to_option(), out_schema.json()), out_schema)
    )
    return in_jvm.unionByName(by_python)


def _python_decoder(schema_json: str, encoding_option: str, out_schema_json: str) -> Any:
    """The Python decoder over Arrow batches of raw records (runs in Spark's Python workers)."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        from cdc_platform.lake.kafka_source import decode_raw_batches

        yield from decode_raw_batches(batches, schema_json, encoding_option, out_schema_json)

    return decode


def _jvm_rows(raw: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """Every record decoded in Spark SQL, with ``__jvm``: whether that decoding is exact
    (else the record is the Python decoder's) and the raw columns."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    envelope = F.from_json(value, _envelope_wire(schema), JSON_OPTIONS)
    parts = ("op", "source", "before", "after")
    env, top = F.col("__env"), F.col("__top")
    frame = raw.select(
        *RAW_COLUMNS, value.alias("__text"), envelope.alias("__env"), F.json_object_keys(value).alias("__top")
    ).select(
        "*",
        F.when(wrapped_in(top), F.lit("$.payload.")).otherwise(F.lit("$.")).alias("__path"),
        F.when(wrapped_in(top), F.struct(*[env["payload"][p].alias(p) for p in parts]))
        .otherwise(F.struct(*[env[p].alias(p) for p in parts]))
        .alias("__p"),
    )
    payload = F.col("__p")
    is_tombstone, is_t = F.col("value").isNull(), payload["op"] == "t"
    lsn, tx_id = _digits(payload["source"]["lsn"]), _digits(payload["source"]["txId"])
    commit_lsn, commit_ok = _commit_lsn(payload["source"]["sequence"], lsn)
    images = {part: _image(payload[part], schema, encoding) for part in ("before", "after")}
    key, unknown = _key(schema), _unknown_columns(schema)
    checks = [lsn.ok, tx_id.ok, commit_ok, unknown.ok]
    checks += [~(payload[part].isNotNull() & ~is_t) | ok for part, (_, ok) in images.items()]
    ok = F.when(is_tombstone, key.ok & F.col("key").isNotNull()).otherwise(
        F.coalesce(_envelope_ok(payload, value, schema, checks), F.lit(False)) & key.ok
    )
    not_t = F.when(is_tombstone | is_t, F.lit(None))
    return frame.select(
        *RAW_COLUMNS,
        F.coalesce(ok, F.lit(False)).alias("__jvm"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.when(F.col("timestampType") >= 0, F.col("timestamp")).alias("kafka_timestamp"),
        F.when(~is_tombstone, payload["op"]).alias("op"),
        is_tombstone.alias("is_tombstone"),
        F.when(~is_tombstone, commit_lsn).alias("commit_lsn"),
        F.when(~is_tombstone, lsn.value).alias("lsn"),
        F.when(~is_tombstone, tx_id.value).alias("tx_id"),
        F.when(~is_tombstone, F.timestamp_millis(payload["source"]["ts_ms"])).alias("source_ts"),
        key.value.alias("key_json"),
        not_t.otherwise(images["before"][0]).alias("before"),
        not_t.otherwise(images["after"][0]).alias("after"),
        F.when(is_tombstone | is_t | payload["after"].isNull(), F.array().cast("array<string>"))
        .otherwise(_unavailable(payload["after"], schema, encoding))
        .alias("unavailable"),
        not_t.otherwise(unknown.value).alias("unknown_columns"),
        F.lit(None).cast("string").alias("error"),
        F.lit(None).cast("binary").alias("raw_key"),
        F.lit(None).cast("binary").alias("raw_value"),
    )


def _envelope_ok(payload: Column, value: Column, schema: TableSchema, checks: list[Column]) -> Column:
    """Whether a (non-tombstone) record is a change event Spark SQL decodes exactly as
    ``changes.decode_record`` does; ``checks``: its fields' own."""
    from pyspark.sql import functions as F

    op = payload["op"]
    ok = (
        F.col("__env").isNotNull()
        & F.col(f"__env.{CORRUPT}").isNull()
        & F.expr("is_valid_utf8(value)")
        & (F.size("__top") == F.size(F.array_distinct("__top")))
        & ~value.contains("cdc_unconvertible")
        & op.isin("r", "c", "u", "d", "t")
        & _no_string_token_where_text_is_expected(value, schema)
        & payload["source"].isNotNull()
        & (~op.isin("c", "u", "r") | payload["after"].isNotNull())
        & ((op != "d") | payload["before"].isNotNull() | F.col("key").isNotNull())
    )
    for check in checks:
        ok = ok & check
    return ok


def wrapped_in(top_keys: Column) -> Column:
    """Connect's JSON converter with schemas: ``{"schema": …, "payload": …}``."""
    from pyspark.sql import functions as F

    return F.array_contains(top_keys, "schema") & F.array_contains(top_keys, "payload")


@dataclass(frozen=True)
class Checked:
    value: Column
    ok: Column


def _envelope_wire(schema: TableSchema) -> Any:
    """``from_json``'s schema for a value: every column as its JSON token's type."""
    from pyspark.sql import types as T

    image = T.StructType([T.StructField(c.name, _wire_type(c), True) for c in schema.columns])
    source = T.StructType(
        [
            T.StructField("lsn", T.StringType()),
            T.StructField("sequence", T.StringType()),
            T.StructField("txId", T.StringType()),
            T.StructField("ts_ms", T.LongType()),
        ]
    )
    payload = [
        T.StructField("op", T.StringType()),
        T.StructField("source", source),
        T.StructField("before", image),
        T.StructField("after", image),
    ]
    return T.StructType(
        [
            *payload,
            T.StructField("payload", T.StructType(payload)),
            T.StructField(CORRUPT, T.StringType()),
        ]
    )


def _wire_type(column: LakeColumn) -> DataType:
    from pyspark.sql import types as T

    kind = column.pgtype.kind
    if kind in INT_RANGES or kind in ("date", "timestamp", "time"):
        return T.LongType()
    if kind in ("float32", "float64"):
        return T.DoubleType()
    if kind == "bool":
        return T.BooleanType()
    return T.StringType()


def _image(image: Column, schema: TableSchema, encoding: ValueEncoding) -> tuple[Column, Column]:
    """(the image as the lake's row struct, whether every column decoded in the JVM)."""
    from pyspark.sql import functions as F

    values, ok = [], F.lit(True)
    for column in schema.columns:
        decoding = _column(image[column.name], column, encoding)
        values.append(F.when(decoding.unavailable, F.lit(None)).otherwise(decoding.value).alias(column.name))
        ok = ok & ~F.coalesce(decoding.needs_python, F.lit(False))
    return F.when(image.isNotNull(), F.struct(*values).cast(row_type(schema))), ok


def _unavailable(image: Column, schema: TableSchema, encoding: ValueEncoding) -> Column:
    from pyspark.sql import functions as F

    names = [F.when(_column(image[c.name], c, encoding).unavailable, F.lit(c.name)) for c in schema.columns]
    if not names:
        return F.array().cast("array<string>")
    return F.filter(F.array(*names), lambda n: n.isNotNull())


def _column(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    """One column's lake value in Spark SQL, exactly as ``changes.lake_value`` gives it."""
    convert = _CONVERSIONS.get(column.pgtype.kind, _text)
    return convert(raw, column, encoding)


def _integer(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    low, high = INT_RANGES[column.pgtype.kind]  # beyond: Arrow's error row, from the Python decoder
    return ColumnDecoding(raw.try_cast(_target(column)), raw.isNotNull() & ~raw.between(low, high), F.lit(False))


def _float(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    # NaN and ±inf to Python: it reads 1e400 as inf but refuses a 400-digit integer
    return ColumnDecoding(raw.try_cast(_target(column)), F.isnan(raw) | (F.abs(raw) == float("inf")), F.lit(False))


def _boolean(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    return ColumnDecoding(raw, F.lit(False), F.lit(False))


def _date(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    fits = raw.between(-(2**31), 2**31 - 1)
    return ColumnDecoding(F.date_from_unix_date(raw.try_cast("int")), raw.isNotNull() & ~fits, F.lit(False))


def _array(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    """Arrays: the Python decoder (element types, declared dimensions)."""
    from pyspark.sql import functions as F

    placeholder = raw == F.lit(UNAVAILABLE)
    return ColumnDecoding(F.lit(None).cast(_target(column)), raw.isNotNull() & ~placeholder, placeholder)


def _text(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    """Text-like kinds (timetz too): the JSON string itself; another token sends the record
    to Python (``_no_string_token``)."""
    from pyspark.sql import functions as F

    return ColumnDecoding(raw, F.lit(False), raw == F.lit(UNAVAILABLE))


def _target(column: LakeColumn) -> DataType:
    return lake_type(column.pgtype, column.typmod, column.dims)


def _timestamp(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    unit = 1000 if encoding.in_millis("timestamp", column.typmod) else 1
    fits = raw.between(INT64_MIN // unit + 1, INT64_MAX // unit)
    micros = F.try_multiply(raw, F.lit(unit)) if unit != 1 else raw
    value = F.timestamp_micros(micros).try_cast("timestamp_ntz")  # the session's time zone is UTC
    return ColumnDecoding(value, raw.isNotNull() & ~fits, F.lit(False))


def _time_of_day(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    """``changes.format_time_micros``: 'HH:MM:SS' and the fraction without trailing zeros."""
    from pyspark.sql import functions as F

    unit = 1000 if encoding.in_millis("time", column.typmod) else 1
    micros = F.try_multiply(raw, F.lit(unit)) if unit != 1 else raw
    fraction = micros % 1_000_000
    clock = F.format_string(
        "%02d:%02d:%02d", F.floor(micros / 3_600_000_000), F.floor(micros / 60_000_000) % 60,
        F.floor(micros / 1_000_000) % 60,
    )  # fmt: skip
    fraction_text = F.when(fraction > 0, F.rtrim(F.format_string(".%06d", fraction), F.lit("0"))).otherwise("")
    text = F.when(micros.isNotNull(), F.concat(clock, fraction_text))
    return ColumnDecoding(text, raw.isNotNull() & ~F.coalesce(micros >= 0, F.lit(False)), F.lit(False))


def _bytea(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    placeholder = (raw == F.lit(UNAVAILABLE)) | (raw == F.lit(encoding.binary_text(UNAVAILABLE.encode())))
    if encoding.binary == "hex":
        valid = raw.rlike(_HEX)
        value = F.when(valid, F.unhex(raw))
    elif encoding.binary in ("bytes", "base64"):
        valid = raw.rlike(_BASE64)
        value = F.when(valid, F.try_to_binary(raw, F.lit("base64")))
    else:  # url-safe base64: the Python decoder
        value, valid = F.lit(None).cast("binary"), F.lit(False)
    return ColumnDecoding(value, raw.isNotNull() & ~placeholder & ~valid, placeholder)


def _instant(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    placeholder = raw == F.lit(UNAVAILABLE)
    parsed = F.try_to_timestamp(raw, F.lit("yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]'Z'"))
    value = (
        F.when(raw == "infinity", F.timestamp_micros(F.lit(INT64_MAX)))
        .when(raw == "-infinity", F.timestamp_micros(F.lit(INT64_MIN)))
        .when(raw.rlike(_UTC_INSTANT), parsed)
    )
    return ColumnDecoding(value, raw.isNotNull() & ~placeholder & value.isNull(), placeholder)


def _decimal(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    placeholder = raw == F.lit(UNAVAILABLE)
    kind = column.pgtype.kind
    scale = (19, 2) if kind == "money" else numeric_precision_scale(column.typmod)
    if scale is None or scale[0] > MAX_SPARK_DECIMAL_PRECISION:  # numeric kept as text: the Python decoder
        return ColumnDecoding(raw, raw.isNotNull() & ~placeholder, placeholder)
    precision, digits = scale
    target = f"decimal({precision},{digits})"
    if encoding.decimal == "precise":
        text = _unscaled_text(raw, digits)
    else:  # decimal text: exact when it has no more decimals than the column
        fraction = F.coalesce(F.length(F.regexp_extract(raw, r"\.([0-9]+)$", 1)), F.lit(0))
        text = F.when(raw.rlike(_DECIMAL_TEXT) & (fraction <= digits), raw)
    value = text.try_cast(target)
    return ColumnDecoding(value, raw.isNotNull() & ~placeholder & value.isNull(), placeholder)


def _unscaled_text(raw: Column, scale: int) -> Column:
    """Debezium's precise decimal (base64 of the big-endian two's-complement unscaled
    value) as decimal text with ``scale`` decimals; null when it is longer than 7 bytes."""
    from pyspark.sql import functions as F

    data = F.when(raw.rlike(_BASE64), F.try_to_binary(raw, F.lit("base64")))
    size = F.length(data)
    unsigned = F.conv(F.hex(data), 16, 10).try_cast("bigint")
    negative = F.conv(F.substring(F.hex(data), 1, 2), 16, 10).try_cast("int") >= 128
    two_to_bits = F.pow(F.lit(2), F.least(size, F.lit(MAX_JVM_DECIMAL_BYTES)) * 8).try_cast(
        "bigint"
    )  # exact: a power of two below 2^63
    unscaled = unsigned - F.when(negative, two_to_bits).otherwise(F.lit(0))
    plain = F.abs(unscaled).try_cast("string")
    digits = F.lpad(plain, F.greatest(F.length(plain), F.lit(scale + 1)), "0")  # lpad also cuts: never shorter
    whole = F.substring(digits, F.lit(1), F.length(digits) - scale) if scale else digits
    text = F.concat(F.when(unscaled < 0, F.lit("-")).otherwise(F.lit("")), whole)
    if scale:
        text = F.concat(text, F.lit("."), F.substring(digits, -scale, scale))
    return F.when(raw.rlike(_BASE64) & size.between(1, MAX_JVM_DECIMAL_BYTES), text)


def _digits(raw: Column) -> Checked:
    """``changes._int_or_none``: an integer or a string of digits, else null; one past
    64 bits is a value Python keeps and Arrow refuses (the Python decoder's error row)."""
    from pyspark.sql import functions as F

    digits = raw.rlike(r"^-?[0-9]+$")
    value = F.when(digits, raw.try_cast("bigint"))
    return Checked(value, F.coalesce(~digits | value.isNotNull(), F.lit(True)))


def _commit_lsn(sequence: Column, lsn: Checked) -> tuple[Column, Column]:
    """The commit position: the first of ``source.sequence`` (a JSON text ``["<lsn>", …]``), else the LSN."""
    from pyspark.sql import functions as F

    listed = F.from_json(sequence, "array<string>", {k: v for k, v in JSON_OPTIONS.items() if k.startswith("allow")})
    first = F.try_element_at(listed, F.lit(1))
    number = first.try_cast("bigint")
    value = F.when(sequence.isNull() | first.isNull(), lsn.value).otherwise(number)
    ok = sequence.isNull() | (listed.isNotNull() & (F.size(listed) >= 1) & (first.isNull() | number.isNotNull()))
    return value, F.coalesce(ok, F.lit(False))


def _image_keys(part: str) -> Column:
    from pyspark.sql import functions as F

    text = F.when(F.col("__path") == "$.payload.", F.get_json_object("__text", f"$.payload.{part}")).otherwise(
        F.get_json_object("__text", f"$.{part}")
    )
    return F.coalesce(F.json_object_keys(text), F.array().cast("array<string>"))


def _unknown_columns(schema: TableSchema) -> Checked:
    """Fields of the images the schema does not know (sorted), and whether no image repeats a field."""
    from pyspark.sql import functions as F

    known = F.array(*[F.lit(n) for n in schema.names]) if schema.names else F.array().cast("array<string>")
    before, after = _image_keys("before"), _image_keys("after")
    extra = F.array_sort(F.array_distinct(F.array_except(F.concat(before, after), known)))
    unique = (F.size(before) == F.size(F.array_distinct(before))) & (F.size(after) == F.size(F.array_distinct(after)))
    return Checked(F.when(F.size(extra) > 0, extra), unique)


def _key(schema: TableSchema) -> Checked:
    """``key_json`` as the Python decoder writes it (``json.dumps``, compact), for plain
    keys: exactly the key columns in order, integers or ASCII strings without escapes."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    key = F.col("key")
    columns = [schema.column(name) for name in schema.key]
    plain = {"int16", "int32", "int64", "text", "uuid", "enum"}
    if not columns or any(c is None or c.pgtype.kind not in plain for c in columns):
        return Checked(F.lit(None).cast("string"), key.isNull())
    text = key.cast("string")
    top = F.json_object_keys(text)
    payload = F.when(wrapped_in(top), F.get_json_object(text, "$.payload")).otherwise(text)
    wire = T.StructType([T.StructField(c.name, _wire_type(c)) for c in columns if c is not None] + [
        T.StructField(CORRUPT, T.StringType())
    ])  # fmt: skip
    parsed = F.from_json(payload, wire, JSON_OPTIONS)
    value = F.to_json(F.struct(*[parsed[name].alias(name) for name in schema.key]), {"ignoreNullFields": "false"})
    texts = [c.name for c in columns if c is not None and _wire_type(c).typeName() == "string"]
    ok = (
        F.expr("is_valid_utf8(key)")
        & text.rlike(_PLAIN_KEY_TEXT)
        & (F.size(top) == F.size(F.array_distinct(top)))
        & (F.json_object_keys(payload) == F.array(*[F.lit(n) for n in schema.key]))
        & parsed[CORRUPT].isNull()
        & _no_string_token(text, texts)
    )
    return Checked(F.when(key.isNotNull(), value), key.isNull() | F.coalesce(ok, F.lit(False)))


def _no_string_token_where_text_is_expected(value: Column, schema: TableSchema) -> Column:
    """False when a field the JVM reads as text (a string-wire column, ``source.sequence``)
    holds another JSON token: Spark would take its text, Python its value."""
    names = [c.name for c in schema.columns if _wire_type(c).typeName() == "string"] + ["sequence"]
    return _no_string_token(value, names)


def _no_string_token(text: Column, names: list[str]) -> Column:
    """Whether ``text`` has no ``"<name>": <a token other than a string or null>``. A
    pattern that matches more than needed only sends records to Python."""
    from pyspark.sql import functions as F

    if not names:
        return F.lit(True)
    if any("\\E" in n or '"' in n or "\\" in n for n in names):
        return F.lit(False)  # names a pattern cannot quote: every record to Python
    alternatives = "|".join(f"\\Q{n}\\E" for n in names)
    return ~F.coalesce(text.rlike(f'"(?:{alternatives})"\\s*:\\s*[^"\\sn]'), F.lit(False))


_CONVERSIONS = {
    "int16": _integer, "int32": _integer, "int64": _integer, "float32": _float, "float64": _float,
    "bool": _boolean, "date": _date, "timestamp": _timestamp, "time": _time_of_day, "timestamptz": _instant,
    "numeric": _decimal, "money": _decimal, "bytea": _bytea, "array": _array,
}  # fmt: skip
