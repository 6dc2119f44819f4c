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
7 bytes, or decimal text), bytea (base64 or hex), text-like kinds, one-dimensional arrays of
text-like kinds, and the unavailable (TOAST) placeholder. Python decodes: other arrays,
time/timetz as integers, numeric beyond those, and anything unusual. Where a JSON value's
token matters (``"5"`` is not ``5`` for an integer column) the typed parse marks the record
corrupt; for text columns, where Spark would silently take a number's text, the value's
token read from a second parse as a variant (``try_parse_json``) sends records with a
non-string token to Python; for text arrays, where Spark would take a number's or a nested
array's text as an element, the array written back as JSON must be the field's JSON
exactly. The variant parse also gives the images' field names (fields the schema lacks)
and refuses any field named twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from cdc_platform.envelope.changes import INSTANT_MILLIS, NON_FINITE
from cdc_platform.envelope.debezium import UNAVAILABLE
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.envelope.pgtypes import INT64_MAX, INT64_MIN, numeric_precision_scale
from cdc_platform.kafka.clients import CHANGELOG_GROUP_ID
from cdc_platform.kafka.java_client import java_client_settings
from cdc_platform.lake.lake_types import MAX_SPARK_DECIMAL_PRECISION, lake_type, row_type
from cdc_platform.model.tables import LakeColumn, TableSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from cdc_platform.config.model import KafkaConfig

RAW_COLUMNS = ("partition", "offset", "timestamp", "timestampType", "key", "value")
INT_RANGES = {"int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1), "int64": (INT64_MIN, INT64_MAX)}
MAX_JVM_DECIMAL_BYTES = 7  # unscaled values up to 56 bits: conv() and bigint arithmetic stay exact
CORRUPT = "__corrupt"
MAX_TIME_OF_DAY_MICROS = 86_400_000_000  # 24:00:00
OFFSETS_PER_TASK = 20_000
# A range ends where the topic ends (a batch reads up to the end offsets): the consumer's
# last fetch finds nothing new and the broker holds it for fetch.max.wait.ms (500 ms by
# default) per task. Reading a few records cost 1.2 s, with this 0.17 s.
FETCH_MAX_WAIT_MS = 10
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
_PATH_NAME = r"^[A-Za-z0-9_]+$"  # a column name a JSON path ($.after.<name>) spells as it is


@dataclass(frozen=True)
class ColumnDecoding:
    """A column's value in the JVM: the lake value, and when Python must decode the record instead."""

    value: Column
    needs_python: Column
    unavailable: Column
    # also Python's when the value came out null from a non-null raw value (checked on the
    # value's column in a later stage: repeating the conversion here doubled its cost)
    python_if_null: bool = False


def changelog_group_id(bootstrap_servers: str, client: dict[str, str]) -> str:
    """``cdc_platform.changelog.<digest of the connection's settings>``: Spark keeps one pooled
    consumer per group and partition and fails a read whose settings differ from the pooled
    one's ("Kafka parameters for same cache key should be equal"), so one application reading
    a topic through two listeners or clusters needs a group per setting. The settings hold
    ``${env:VAR}`` placeholders, never secrets; the digest is stable across processes."""
    settings = json.dumps([bootstrap_servers, sorted(client.items())])
    return f"{CHANGELOG_GROUP_ID}.{hashlib.sha256(settings.encode()).hexdigest()[:12]}"


def kafka_source_options(kafka: KafkaConfig, topic: str, spans: list[tuple[int, int, int]]) -> dict[str, str]:
    """Spark's Kafka source reading exactly ``[start, end)`` of each partition, with the
    cluster's TLS/SASL settings as Java's client names them (``kafka.java_client``)."""
    spans = [(p, s, e) for p, s, e in spans if e > s]
    client = java_client_settings(kafka.options, kafka.secret_options_env).properties
    return {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        **{f"kafka.{key}": value for key, value in client.items()},
        # the platform's group-id scheme (one ACL prefix covers every client). Spark otherwise
        # names a new group per query and keys its pooled consumers by group and partition:
        # every micro-batch opened new consumers and evicted old ones ("Pool exceeds its soft
        # max size"). Nothing is committed: positions live in the ledger, partitions are assigned.
        "kafka.group.id": changelog_group_id(kafka.bootstrap_servers, client),
        "assign": json.dumps({topic: [p for p, _, _ in spans]}),
        "startingOffsets": json.dumps({topic: {str(p): s for p, s, _ in spans}}),
        "endingOffsets": json.dumps({topic: {str(p): e for p, _, e in spans}}),
        # compaction and transaction markers leave offsets without records inside a range (as
        # the Python reader, skip them); offsets retention deleted are found after the read,
        # from the topic's earliest offsets (changelog._ensure_nothing_deleted)
        "failOnDataLoss": "false",
        # committed records only, as every other reader of the platform (librdkafka's default;
        # Java's client reads uncommitted, aborted transactions' records included)
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "false",
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
        # long ranges cut into several tasks, so every core decodes (as the Python reader does)
        "minPartitions": str(max(1, -(-sum(e - s for _, s, e in spans) // OFFSETS_PER_TASK))),
    }


def read_raw(spark: SparkSession, kafka: KafkaConfig, topic: str, spans: list[tuple[int, int, int]]) -> DataFrame:
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
    options = kafka_source_options(kafka, topic, spans)
    return spark.read.format("kafka").options(**options).load().select(*RAW_COLUMNS)


def decode_raw(raw: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """Change rows (``kafka_source.change_schema``) of raw Kafka records: decoded in Spark
    SQL where that is exact, by the Python decoder otherwise. One pass, for readers that do
    not cache: every row goes through one Arrow hop (``mapInArrow``), where Spark SQL's rows
    pass untouched and the others are decoded; two filtered branches would evaluate the
    Spark SQL twice. (The stream apply caches ``jvm_decoded`` and sends only the records
    Spark SQL cannot decode to ``python_decoded``: ``changelog._read_decoded``.)"""
    return _through_python(jvm_decoded(raw, schema, encoding), schema, encoding)


def jvm_decoded(raw: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """Every record decoded in Spark SQL: the change rows' columns, ``__jvm`` (whether that
    decoding is exact) and, where it is not, what the Python decoder needs (the raw
    record)."""
    return _jvm_rows(raw, schema, encoding).select(*_stages(raw.sparkSession, schema, encoding)[-1])


def python_decoded(rows: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """The records of ``jvm_decoded`` that Spark SQL cannot decode exactly, decoded by the
    Python decoder in Spark's Python workers (Arrow batches), error rows included."""
    from pyspark.sql import functions as F

    return _through_python(rows.where(~F.col("__jvm")), schema, encoding)


def _through_python(rows: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """``jvm_decoded`` rows through the Python decoder: ``__jvm`` rows pass, the others are decoded."""
    out_schema = change_schema_of(schema)
    return rows.mapInArrow(_python_decoder(schema.to_json(), encoding.to_option(), out_schema.json()), out_schema)


def exact_rows(rows: DataFrame, schema: TableSchema) -> DataFrame:
    """The records of ``jvm_decoded`` that Spark SQL decoded exactly, as change rows."""
    from pyspark.sql import functions as F

    return rows.where(F.col("__jvm")).select(*change_schema_of(schema).names)


def change_schema_of(schema: TableSchema) -> StructType:
    from cdc_platform.lake.kafka_source import change_schema

    return change_schema(row_type(schema))


def _python_decoder(schema_json: str, encoding_option: str, out_schema_json: str) -> Any:
    """Runs in Spark's Python workers: rows Spark SQL decoded pass through, the others
    (``__jvm`` false) are decoded from their raw columns by the Python decoder."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        from cdc_platform.lake.kafka_source import decode_mixed_batches

        yield from decode_mixed_batches(batches, schema_json, encoding_option, out_schema_json)

    return decode


def _jvm_rows(raw: DataFrame, schema: TableSchema, encoding: ValueEncoding) -> DataFrame:
    """Every record decoded in Spark SQL, with ``__jvm``: whether that decoding is exact
    (else the record is the Python decoder's) and the raw columns. In stages: each
    expensive expression (a parse, a pattern, a conversion) is one column of a stage and
    later stages refer to it by name, so Spark evaluates it once per record, not once per
    reference (one flat projection parsed each envelope ten times and ran 110 patterns)."""
    frame = raw
    for stage in _stages(raw.sparkSession, schema, encoding)[:-1]:
        frame = frame.select(*stage)
    return frame


Stage: TypeAlias = "list[Column | str]"
_STAGES_LOCK = threading.Lock()
_STAGES: weakref.WeakKeyDictionary[SparkSession, dict[tuple[str, str], list[Stage]]] = weakref.WeakKeyDictionary()


def _stages(spark: SparkSession, schema: TableSchema, encoding: ValueEncoding) -> list[Stage]:
    """The decoding's stages (each a ``select``'s columns; the last one is ``jvm_decoded``'s),
    built once per session, table schema and encoding. Each column is a py4j call or
    several: building them took about 0.6 s for a five-column table, on every micro-batch,
    while the columns themselves (unresolved expressions) serve any frame of raw records."""
    key = (schema.to_json(), encoding.to_option())
    with _STAGES_LOCK:
        built = _STAGES.setdefault(spark, {})
        if key not in built:
            decodings = _decodings(schema, encoding)
            built[key] = [
                *_parsed(schema),
                ["*", *_conversions(schema, decodings)],
                ["*", *_assembled(schema, decodings)],
                _row_columns(),
                _decoded_columns(schema),
            ]
        return built[key]


def _row_columns() -> Stage:
    """The change row's columns from the assembled stage, and ``__jvm``."""
    from pyspark.sql import functions as F

    payload, key = F.col("__p"), F.col("key")
    is_tombstone, is_t = F.col("value").isNull(), payload["op"] == "t"
    checks = ["__lsn_ok", "__tx_ok", "__commit_ok", "__unknown_ok", "__guard"]
    checks_ok = F.lit(True)
    for check in checks:
        checks_ok = checks_ok & F.col(check)
    for part in ("before", "after"):
        checks_ok = checks_ok & (~(payload[part].isNotNull() & ~is_t) | F.col(f"__{part}_ok"))
    ok = F.when(is_tombstone, F.col("__key_ok") & key.isNotNull()).otherwise(
        F.coalesce(_envelope_ok(payload) & checks_ok, F.lit(False)) & F.col("__key_ok")
    )
    not_t = F.when(is_tombstone | is_t, F.lit(None))
    return [
        *RAW_COLUMNS,
        F.coalesce(ok, F.lit(False)).alias("__jvm"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.when(F.col("timestampType") >= 0, _kafka_time(F.col("timestamp"))).alias("kafka_timestamp"),
        F.when(~is_tombstone, payload["op"]).alias("op"),
        is_tombstone.alias("is_tombstone"),
        F.when(~is_tombstone, F.col("__commit")).alias("commit_lsn"),
        F.when(~is_tombstone, F.col("__lsn")).alias("lsn"),
        F.when(~is_tombstone, F.col("__tx")).alias("tx_id"),
        F.when(~is_tombstone, _instant_of_millis(payload["source"]["ts_ms"])).alias("source_ts"),
        F.col("__key_json").alias("key_json"),
        not_t.otherwise(F.col("__before")).alias("before"),
        not_t.otherwise(F.col("__after")).alias("after"),
        F.when(is_tombstone | is_t | payload["after"].isNull(), F.array().cast("array<string>"))
        .otherwise(F.col("__unavailable"))
        .alias("unavailable"),
        not_t.otherwise(F.col("__unknown")).alias("unknown_columns"),
        F.lit(None).cast("string").alias("error"),
        F.lit(None).cast("binary").alias("raw_key"),
        F.lit(None).cast("binary").alias("raw_value"),
    ]


def _instant_of_millis(millis: Column) -> Column:
    """``changes.instant_of_millis``: null outside ``INSTANT_MILLIS`` (beyond ±2^63 µs
    ``timestamp_millis`` failed the whole batch)."""
    from pyspark.sql import functions as F

    return F.when(millis.between(*INSTANT_MILLIS), F.timestamp_millis(millis))


def _kafka_time(timestamp: Column) -> Column:
    """A record's Kafka timestamp, null outside ``INSTANT_MILLIS`` as Python has it."""
    from pyspark.sql import functions as F

    return _instant_of_millis(F.unix_millis(timestamp))


def _decoded_columns(schema: TableSchema) -> Stage:
    """``jvm_decoded``'s columns: the change row, ``__jvm``, and the raw record only where
    Python decodes."""
    from pyspark.sql import functions as F

    jvm = F.col("__jvm")
    return [
        *change_schema_of(schema).names,
        jvm,
        *[F.col(c) for c in RAW_COLUMNS if c not in ("key", "value")],
        *[F.when(~jvm, F.col(c)).alias(c) for c in ("key", "value")],  # raw bytes only where Python decodes
    ]


def _parsed(schema: TableSchema) -> list[Stage]:
    """Stage 1: the value parsed once with the table's types (``__env``) and once as a
    variant (``__j``); the images' fields as maps of variants (``__before_fields``,
    ``__after_fields``: their names, and each value's JSON token) and the payload (``__p``:
    the envelope itself, or Connect's ``payload``). The variant parse refuses a field named
    twice at any depth (the record goes to Python), so no field list is checked for
    repeats. It replaced three field-list parses and a pattern over the text: a warm
    200 000-record decode took 4.2 s with them."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    parts = ("op", "source", "before", "after")
    env, wrapped = F.col("__env"), F.col("__wrapped")
    key_text = F.col("key").cast("string")
    first: Stage = [
        *RAW_COLUMNS,
        value.alias("__text"),
        _typed_parse(value, _envelope_wire(schema)).alias("__value_parse"),
        F.try_parse_json(F.concat(F.lit("["), value, F.lit("]"))).alias("__j"),
        _typed_parse(key_text, _key_wire(schema)).alias("__key_parse"),
    ]
    second: Stage = [
        "*",
        F.col("__value_parse.k").alias("__env"),
        F.col("__key_parse.k").alias("__key_env"),
        _wrapped(F.col("__key_parse.k")).alias("__key_wrapped"),
        _wrapped(F.col("__value_parse.k")).alias("__wrapped"),
    ]
    third: Stage = [
        "*",
        F.when(wrapped, F.lit("$.payload.")).otherwise(F.lit("$.")).alias("__path"),
        F.when(wrapped, F.struct(*[env["payload"][p].alias(p) for p in parts]))
        .otherwise(F.struct(*[env[p].alias(p) for p in parts]))
        .alias("__p"),
        *[_at(part, "map<string,variant>").alias(f"__{part}_fields") for part in ("before", "after")],
        _at("source.sequence", "variant").alias("__sequence_token"),
        _key_value(schema).alias("__key_value"),
    ]
    return [first, second, third]


def _typed_parse(text: Column, wire: StructType) -> Column:
    """``text`` parsed with ``wire``'s types, as field ``k`` of ``{"k": <text>}``, with the
    corrupt-record column beside it. Spark's parser stops at the end of the first JSON value
    and ignores what follows; Python's refuses it ("Extra data"). So the value is parsed
    inside an object here and inside an array by the variant parse (``[<text>]``, ``__j``),
    and what follows it must fit both: ``]`` breaks the object, ``}`` the array, and after
    a ``,`` the object needs ``"name":`` where the array needs a value (never both). A
    record either parse refuses is Python's."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    one_value = T.StructType([T.StructField("k", wire), T.StructField(CORRUPT, T.StringType())])
    return F.from_json(F.concat(F.lit('{"k":'), text, F.lit("}")), one_value, JSON_OPTIONS)


def _wrapped(parsed: Column) -> Column:
    """A value or key in Connect's ``{"schema": …, "payload": …}``, from its typed parse
    (``schema`` an empty struct: skipped, not copied). A JSON null in either reads as not
    wrapped where Python reads it as wrapped: nothing the JVM needs is then at the top,
    and the record goes to Python."""
    from pyspark.sql import functions as F

    return F.coalesce(parsed["schema"].isNotNull() & parsed["payload"].isNotNull(), F.lit(False))


def _at(path: str, as_type: str) -> Column:
    """The variant's value at ``path`` of the payload (``after``, ``source.sequence``), with or
    without Connect's ``payload``, as ``as_type``; SQL null when missing or of another shape."""
    from pyspark.sql import functions as F

    parsed = F.col("__j")  # the value as the one element of an array (``_typed_parse``)
    return F.when(F.col("__wrapped"), F.try_variant_get(parsed, f"$[0].payload.{path}", as_type)).otherwise(
        F.try_variant_get(parsed, f"$[0].{path}", as_type)
    )


Decodings: TypeAlias = "dict[tuple[str, int], ColumnDecoding]"


def _decodings(schema: TableSchema, encoding: ValueEncoding) -> Decodings:
    """Each column of each image in Spark SQL, by (image, column index): built once for
    stage 2's values and stage 3's checks (each conversion is dozens of py4j calls)."""
    from pyspark.sql import functions as F

    payload = F.col("__p")
    decodings: Decodings = {}
    for part in ("before", "after"):
        for i, column in enumerate(schema.columns):
            raw = payload[part][column.name]
            if _text_array_in_jvm(column):
                decodings[part, i] = _text_array(raw, _json_at(f"{part}.{column.name}"))
            else:
                decodings[part, i] = _column(raw, column, encoding)
    return decodings


def _conversions(schema: TableSchema, decodings: Decodings) -> list[Column]:
    """Stage 2: each column of each image converted, the key, positions, field lists, the text guard."""
    from pyspark.sql import functions as F

    payload = F.col("__p")
    columns: list[Column] = []
    for part in ("before", "after"):
        for i in range(len(schema.columns)):
            decoding = decodings[part, i]
            columns += [
                decoding.value.alias(f"__{part}{i}"),
                F.coalesce(decoding.needs_python, F.lit(False)).alias(f"__{part}{i}_py"),
                decoding.unavailable.alias(f"__{part}{i}_u"),
            ]
        columns.append(_image_keys(part).alias(f"__{part}_keys"))
    lsn, tx_id = _digits(payload["source"]["lsn"]), _digits(payload["source"]["txId"])
    sequence = F.from_json(
        payload["source"]["sequence"], "array<string>", {k: v for k, v in JSON_OPTIONS.items() if k.startswith("allow")}
    )
    return [
        *columns,
        _key_written_back().alias("__key_payload"),
        lsn.value.alias("__lsn"),
        lsn.ok.alias("__lsn_ok"),
        tx_id.value.alias("__tx"),
        tx_id.ok.alias("__tx_ok"),
        sequence.alias("__sequence"),
        _strings_where_text_is_expected(schema).alias("__guard"),
    ]


def _text_array_in_jvm(column: LakeColumn) -> bool:
    """A one-dimensional array of a text-like kind (text, varchar, uuid, enum, json ...: the
    JSON string is the lake value) under a name a JSON path spells: decoded in Spark SQL."""
    element = column.pgtype.element
    if column.pgtype.kind != "array" or element is None or column.dims > 1:
        return False
    return _CONVERSIONS.get(element.kind, _text) is _text and re.match(_PATH_NAME, column.name) is not None


def _json_at(path: str) -> Column:
    """The value's JSON at ``path`` (``after``, ``after.tags``) inside the envelope, with or
    without Connect's ``payload``: as Jackson writes it back (compact), or the content of a
    string token; null for JSON null or a missing field."""
    from pyspark.sql import functions as F

    return F.when(F.col("__path") == "$.payload.", F.get_json_object("__text", f"$.payload.{path}")).otherwise(
        F.get_json_object("__text", f"$.{path}")
    )


def _text_array(raw: Column, field_json: Column) -> ColumnDecoding:
    """``raw``: the field parsed as ``array<string>`` (a string token marks the record
    corrupt). Spark would also take a number's text or a nested array's JSON as an element,
    where Python keeps the number (then ``str``) or refuses the depth: the array written
    back as JSON must be the field's JSON, i.e. every element was a string or null. The
    unavailable placeholder is ``[UNAVAILABLE]``, as ``changes.is_unavailable`` has it."""
    from pyspark.sql import functions as F

    exact = F.coalesce(F.to_json(raw) == field_json, F.lit(False))
    placeholder = exact & (F.size(raw) == 1) & F.coalesce(F.try_element_at(raw, F.lit(1)) == UNAVAILABLE, F.lit(False))
    return ColumnDecoding(F.when(exact, raw), field_json.isNotNull() & ~exact, placeholder)


def _needs_python(part: str, i: int, column: LakeColumn, decoding: ColumnDecoding) -> Column:
    from pyspark.sql import functions as F

    flagged = F.col(f"__{part}{i}_py")
    if not decoding.python_if_null:
        return flagged
    raw, value, toasted = F.col("__p")[part][column.name], F.col(f"__{part}{i}"), F.col(f"__{part}{i}_u")
    return flagged | F.coalesce(raw.isNotNull() & ~toasted & value.isNull(), F.lit(False))


def _assembled(schema: TableSchema, decodings: Decodings) -> list[Column]:
    """Stage 3: the images as the lake's row structs, what Python must decode, TOAST
    columns, unknown fields, the commit position."""
    from pyspark.sql import functions as F

    payload = F.col("__p")
    columns: list[Column] = []
    for part in ("before", "after"):
        values = [
            F.when(F.col(f"__{part}{i}_u"), F.lit(None)).otherwise(F.col(f"__{part}{i}")).alias(c.name)
            for i, c in enumerate(schema.columns)
        ]
        python = [_needs_python(part, i, column, decodings[part, i]) for i, column in enumerate(schema.columns)]
        columns += [
            F.when(payload[part].isNotNull(), F.struct(*values).cast(row_type(schema))).alias(f"__{part}"),
            (~F.greatest(F.lit(False), *python) if python else F.lit(True)).alias(f"__{part}_ok"),
        ]
    toasted = [F.when(F.col(f"__after{i}_u"), F.lit(c.name)) for i, c in enumerate(schema.columns)]
    unavailable = F.filter(F.array(*toasted), lambda n: n.isNotNull()) if toasted else F.array().cast("array<string>")
    unknown, key = _unknown_columns(schema), _key(schema)
    commit, commit_ok = _commit_lsn(payload["source"]["sequence"], F.col("__sequence"), F.col("__lsn"))
    return [
        *columns,
        unavailable.alias("__unavailable"),
        key.value.alias("__key_json"),
        key.ok.alias("__key_ok"),
        unknown.value.alias("__unknown"),
        unknown.ok.alias("__unknown_ok"),
        commit.alias("__commit"),
        commit_ok.alias("__commit_ok"),
    ]


def _envelope_ok(payload: Column) -> Column:
    """Whether a (non-tombstone) record is a change event whose envelope Spark SQL reads
    exactly as ``changes.decode_record`` does (its fields are checked in their stages)."""
    from pyspark.sql import functions as F

    op = payload["op"]
    return (
        F.col("__env").isNotNull()
        & F.col(f"__value_parse.{CORRUPT}").isNull()
        & F.expr("is_valid_utf8(value)")
        & F.col("__j").isNotNull()  # valid JSON, no field named twice at any depth
        & ~F.col("__text").contains("cdc_unconvertible")
        & op.isin("r", "c", "u", "d", "t")
        & payload["source"].isNotNull()
        & (~op.isin("c", "u", "r") | payload["after"].isNotNull())
        & ((op != "d") | payload["before"].isNotNull() | F.col("key").isNotNull())
    )


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
            T.StructField("schema", T.StructType([])),  # whether it is there (``__wrapped``), not what it says
        ]
    )


def _wire_type(column: LakeColumn) -> DataType:
    from pyspark.sql import types as T

    kind = column.pgtype.kind
    if _text_array_in_jvm(column):
        return T.ArrayType(T.StringType())
    if kind in INT_RANGES or kind in ("date", "timestamp", "time"):
        return T.LongType()
    if kind in ("float32", "float64"):
        return T.DoubleType()
    if kind == "bool":
        return T.BooleanType()
    return T.StringType()


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
    to Python (``_strings_where_text_is_expected``)."""
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
    """``changes.format_time_micros``: 'HH:MM:SS' and the fraction without trailing zeros.
    For times of day (up to 24:00:00, PostgreSQL's last) only: the hours come from a division
    in doubles, exact this small, where ``253402300799999999`` µs gave one hour too many."""
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
    a_time_of_day = F.coalesce(micros.between(0, MAX_TIME_OF_DAY_MICROS), F.lit(False))
    return ColumnDecoding(text, raw.isNotNull() & ~a_time_of_day, F.lit(False))


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
    return ColumnDecoding(value, F.lit(False), placeholder, python_if_null=True)


def _decimal(raw: Column, column: LakeColumn, encoding: ValueEncoding) -> ColumnDecoding:
    from pyspark.sql import functions as F

    placeholder = raw == F.lit(UNAVAILABLE)
    non_finite = raw.isin(*NON_FINITE)  # "Infinity" is base64 too (six bytes): Python reads it as infinity
    kind = column.pgtype.kind
    scale = (19, 2) if kind == "money" else numeric_precision_scale(column.typmod)
    if scale is None or scale[0] > MAX_SPARK_DECIMAL_PRECISION:  # numeric kept as text: the Python decoder
        return ColumnDecoding(raw, raw.isNotNull() & ~placeholder, placeholder)
    precision, digits = scale
    target = f"decimal({precision},{digits})"
    if encoding.decimal == "precise":
        value = _precise_decimal(raw, digits, target)
    else:  # decimal text: exact when it has no more decimals than the column
        fraction = F.coalesce(F.length(F.regexp_extract(raw, r"\.([0-9]+)$", 1)), F.lit(0))
        value = F.when(raw.rlike(_DECIMAL_TEXT) & (fraction <= digits), raw).try_cast(target)
    return ColumnDecoding(value, F.coalesce(non_finite, F.lit(False)), placeholder, python_if_null=True)


def _precise_decimal(raw: Column, scale: int, target: str) -> Column:
    """Debezium's precise decimal (base64 of the big-endian two's-complement unscaled
    value) as ``target``; null when it is not canonical base64 of 1 to 7 bytes (the
    Python decoder's) or does not fit."""
    from decimal import Decimal

    from pyspark.sql import functions as F

    data = F.try_to_binary(raw, F.lit("base64"))
    size = F.length(data)
    digits = F.hex(data)
    unsigned = F.conv(digits, 16, 10).try_cast("bigint")
    negative = F.substring(digits, 1, 1) >= F.lit("8")  # the sign bit of the first byte
    two_to_bits = F.pow(F.lit(2), F.least(size, F.lit(MAX_JVM_DECIMAL_BYTES)) * 8).try_cast("bigint")  # exact
    unscaled = unsigned - F.when(negative, two_to_bits).otherwise(F.lit(0))
    # an integer times 10^-scale: Spark's decimal product keeps every digit (decimal(18,0) x decimal(s,s))
    value = (unscaled.try_cast("decimal(18,0)") * F.lit(Decimal(1).scaleb(-scale))).try_cast(target)
    # round trip: strict (as Python's validate=True) and canonical; at most 12 characters, never chunked
    canonical = F.base64(data) == raw
    return F.when(size.between(1, MAX_JVM_DECIMAL_BYTES) & canonical, value)


def _digits(raw: Column) -> Checked:
    """``changes._int_or_none``: an integer or a string of digits, else null. Exact only
    for an integer Spark writes back as the same text (a JSON integer, or ASCII digits
    without a plus or leading zeros); anything else is Python's: it reads ``"٣"`` (any
    Unicode digit) as 3 and ``"-0"`` as 0, and past 64 bits keeps a value Arrow refuses
    (its error row). Non-digit text is malformed: Python's too, at no cost that matters."""
    from pyspark.sql import functions as F

    value = raw.try_cast("bigint")
    return Checked(value, raw.isNull() | F.coalesce(value.cast("string") == raw, F.lit(False)))


def _commit_lsn(sequence: Column, listed: Column, lsn: Column) -> tuple[Column, Column]:
    """The commit position: the first of ``source.sequence`` (a JSON text ``["<lsn>", …]``,
    ``listed`` parsed), else the LSN. Exact when Spark writes the list back as the same text
    (its parse ignores what follows the list; Python's refuses it) and its first as the
    same digits (Spark's cast trims and takes ``+5``, Python's ``int`` has its own rules)."""
    from pyspark.sql import functions as F

    first = F.try_element_at(listed, F.lit(1))
    number = first.try_cast("bigint")
    value = F.when(sequence.isNull() | first.isNull(), lsn).otherwise(number)
    exact = (F.to_json(listed) == sequence) & (first.isNull() | (number.cast("string") == first))
    ok = sequence.isNull() | (listed.isNotNull() & (F.size(listed) >= 1) & exact)
    return value, F.coalesce(ok, F.lit(False))


def _image_keys(part: str) -> Column:
    """The image's field names (sorted: a variant object's order); empty when it is not an
    object. A field named twice is not seen here: ``try_parse_json`` refuses the record."""
    from pyspark.sql import functions as F

    return F.coalesce(F.map_keys(F.col(f"__{part}_fields")), F.array().cast("array<string>"))


def _unknown_columns(schema: TableSchema) -> Checked:
    """Fields of the images the schema does not know (sorted), and whether no image repeats a field."""
    from pyspark.sql import functions as F

    known = F.array(*[F.lit(n) for n in schema.names]) if schema.names else F.array().cast("array<string>")
    before, after = F.col("__before_keys"), F.col("__after_keys")
    extra = F.array_sort(F.array_distinct(F.array_except(F.concat(before, after), known)))
    unique = (F.size(before) == F.size(F.array_distinct(before))) & (F.size(after) == F.size(F.array_distinct(after)))
    return Checked(F.when(F.size(extra) > 0, extra), unique)


def _plain_key_columns(schema: TableSchema) -> list[LakeColumn] | None:
    """The key columns when every one is an integer or text kind (a key Spark writes as
    Python does) and none is named ``schema`` or ``payload`` (the key's own parse reads
    those as Connect's wrapping), else None: such keys are the Python decoder's."""
    plain = {"int16", "int32", "int64", "text", "uuid", "enum"}
    columns = [schema.column(name) for name in schema.key]
    if not columns or any(c is None or c.pgtype.kind not in plain or c.name in ("schema", "payload") for c in columns):
        return None
    return [c for c in columns if c is not None]


def _key_wire(schema: TableSchema) -> Any:
    """``from_json``'s schema for a key: its columns at the top, or in Connect's ``payload``
    (``schema`` an empty struct: whether it is there, not what it says)."""
    from pyspark.sql import types as T

    columns = [T.StructField(c.name, _wire_type(c)) for c in _plain_key_columns(schema) or []]
    return T.StructType(
        [
            *columns,
            T.StructField("schema", T.StructType([])),
            T.StructField("payload", T.StructType(columns)),
        ]
    )


def _key_value(schema: TableSchema) -> Column:
    """Spark's JSON of the key columns, compact, in order, nulls written."""
    from pyspark.sql import functions as F

    columns = _plain_key_columns(schema)
    if columns is None:
        return F.lit(None).cast("string")
    env, wrapped = F.col("__key_env"), F.col("__key_wrapped")
    values = [F.when(wrapped, env["payload"][c.name]).otherwise(env[c.name]).alias(c.name) for c in columns]
    return F.to_json(F.struct(*values), {"ignoreNullFields": "false"})


def _key_written_back() -> Column:
    """The key's columns' JSON as the key holds it, for ``_key`` to compare: the text itself
    when it is already Spark's JSON of the key (the compact keys capture and Debezium write:
    no second parse), else the key (or its ``payload``) written back by Spark (compact, its
    own escapes), when the text is one JSON value and nothing after it (``[<text>]`` is a
    one-element array; ``_typed_parse`` refuses a text going on with ``]``)."""
    from pyspark.sql import functions as F

    text, wrapped = F.col("key").cast("string"), F.col("__key_wrapped")
    one_value = F.coalesce(F.json_array_length(F.concat(F.lit("["), text, F.lit("]"))) == 1, F.lit(False))
    return (
        F.when(~wrapped & (text == F.col("__key_value")), text)
        .when(~one_value, F.lit(None))
        .when(wrapped, F.get_json_object(text, "$.payload"))
        .otherwise(F.get_json_object(text, "$"))
    )


def _key(schema: TableSchema) -> Checked:
    """``key_json`` as the Python decoder writes it (``json.dumps``, compact, ASCII), for
    plain keys. Exact when the key's columns' JSON as the key holds it (``__key_payload``)
    is Spark's JSON of the key columns (``__key_value``): then it holds exactly those
    columns in order, once each, each with its own token (Spark writes ``"5"`` for a text
    column holding ``5``, ``null`` for an integer one holding ``"5"``). A ``payload`` named
    twice needs no check of its own: Spark's parse keeps the last, as Python does, and the
    text written back is the first (they differ: Python's). And when it is printable ASCII
    without a backslash, which Python writes alike (it escapes everything else; Spark
    writes non-ASCII as it is). One parse and one comparison for a compact key, where three
    parses and two patterns over the text ran."""
    from pyspark.sql import functions as F

    key = F.col("key")
    if _plain_key_columns(schema) is None:
        return Checked(F.lit(None).cast("string"), key.isNull())
    payload, value = F.col("__key_payload"), F.col("__key_value")
    ok = (
        F.expr("is_valid_utf8(key)")
        & F.col(f"__key_parse.{CORRUPT}").isNull()  # (a corrupt parse also nulls the columns: a second guard)
        & (payload == value)
        & (F.octet_length(payload) == F.length(payload))  # one byte per character: ASCII
        & ~payload.contains("\\")
        & ~payload.contains("\x7f")
    )
    return Checked(F.when(key.isNotNull(), value), key.isNull() | F.coalesce(ok, F.lit(False)))


def _strings_where_text_is_expected(schema: TableSchema) -> Column:
    """False when a field the JVM reads as text (a string-wire column of either image,
    ``source.sequence``) holds another JSON token: Spark would take its text, Python its
    value. Read from the images' maps of variants (a JSON null is ``VOID``, a missing field
    SQL null), so any column name is looked up as it is."""
    from pyspark.sql import functions as F

    names = [c.name for c in schema.columns if _wire_type(c).typeName() == "string"]
    tokens = [F.col(f"__{part}_fields")[n] for part in ("before", "after") for n in names]
    ok = F.lit(True)
    for token in [*tokens, F.col("__sequence_token")]:
        ok = ok & F.coalesce(F.schema_of_variant(token).isin("STRING", "VOID"), F.lit(True))
    return ok


_CONVERSIONS = {
    "int16": _integer, "int32": _integer, "int64": _integer, "float32": _float, "float64": _float,
    "bool": _boolean, "date": _date, "timestamp": _timestamp, "time": _time_of_day, "timestamptz": _instant,
    "numeric": _decimal, "money": _decimal, "bytea": _bytea, "array": _array,
}  # fmt: skip
