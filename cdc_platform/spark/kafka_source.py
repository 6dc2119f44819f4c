"""A Spark Python data source reading fixed Kafka offset ranges, decoded into change rows.

Why not Spark's own Kafka source: its dependency ``spark-token-provider-kafka-0-10`` is
not resolvable from Maven Central here, and the changelog needs exact, recorded offset
ranges per window anyway. This source reads ``[start, end)`` of each Kafka partition in
its own Spark task (parallel across partitions) with confluent-kafka, and decodes each
record in the Python worker with ``cdc_platform.envelope.changes`` — the same code the
tests check against Debezium's documented events. Undecodable records come out with
``error`` set and their raw bytes, for the dead-letter table.

Options (strings): ``topic``, ``ranges`` (JSON ``[[partition, start, end], …]``),
``columns`` (JSON, see ``columns_option``), ``client_config`` (JSON, no secrets),
``secret_options_env`` (JSON property -> environment variable, resolved in the worker so
secrets never appear in Spark plans), ``decimal_handling``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cdc_platform.envelope.changes import ChangeDecodeError, LakeColumnSpec, decode_record
from cdc_platform.envelope.pgtypes import PgType

SOURCE_NAME = "cdc_kafka_range"
CONSUME_BATCH = 1000
ARROW_BATCH_ROWS = 4096
OFFSETS_PER_TASK = 20_000


def pgtype_to_dict(pgtype: PgType) -> dict[str, Any]:
    return {
        "oid": pgtype.oid,
        "name": pgtype.name,
        "kind": pgtype.kind,
        "element": pgtype_to_dict(pgtype.element) if pgtype.element else None,
        "enum_values": list(pgtype.enum_values),
    }


def pgtype_from_dict(data: dict[str, Any]) -> PgType:
    element = pgtype_from_dict(data["element"]) if data.get("element") else None
    return PgType(data["oid"], data["name"], data["kind"], element, tuple(data.get("enum_values", ())))


def columns_option(columns: Sequence[LakeColumnSpec]) -> str:
    return json.dumps(
        [{"name": c.name, "pgtype": pgtype_to_dict(c.pgtype), "typmod": c.typmod, "dims": c.dims} for c in columns]
    )


def change_schema(row_type: StructType) -> StructType:
    """The rows this source produces; ``before``/``after`` have the table's lake schema."""
    return StructType(
        [
            StructField("kafka_partition", IntegerType(), False),
            StructField("kafka_offset", LongType(), False),
            StructField("kafka_timestamp", TimestampType(), True),
            StructField("op", StringType(), True),  # c/u/d/t/r; null for tombstones and errors
            StructField("is_tombstone", BooleanType(), False),
            StructField("commit_lsn", LongType(), True),
            StructField("lsn", LongType(), True),
            StructField("tx_id", LongType(), True),
            StructField("source_ts", TimestampType(), True),
            StructField("key_json", StringType(), True),
            StructField("before", row_type, True),
            StructField("after", row_type, True),
            StructField("unavailable", ArrayType(StringType(), False), True),
            StructField("error", StringType(), True),
            StructField("raw_key", BinaryType(), True),
            StructField("raw_value", BinaryType(), True),
        ]
    )


@dataclass
class KafkaRange(InputPartition):
    partition: int
    start: int
    end: int


class KafkaRangeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(dict(self.options), schema)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        # long ranges are cut into several Spark tasks, so every core decodes (Kafka
        # partitions are few and uneven; decoding, not fetching, is the cost)
        step = int(self.options.get("offsets_per_task", OFFSETS_PER_TASK))
        return [
            KafkaRange(int(p), chunk, min(chunk + step, int(e)))
            for p, s, e in json.loads(self.options["ranges"])
            for chunk in range(int(s), int(e), step)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches when the schema is known (as under Spark): Spark then skips
        its per-value conversion of Python rows, which cost more than decoding them."""
        rows = self.read_rows(partition)
        if self.schema is None:
            yield from rows
            return
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")  # exactly what Spark checks against
        batch: list[tuple[Any, ...]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= ARROW_BATCH_ROWS:
                yield _arrow_batch(pa, arrow_schema, batch)
                batch = []
        if batch:
            yield _arrow_batch(pa, arrow_schema, batch)

    def read_rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from confluent_kafka import Consumer, TopicPartition

        if not isinstance(partition, KafkaRange):  # no ranges: Spark reads one empty placeholder
            return
        options = self.options
        columns = [
            LakeColumnSpec(c["name"], pgtype_from_dict(c["pgtype"]), int(c["typmod"]), int(c.get("dims", 1)))
            for c in json.loads(options["columns"])
        ]
        names = [c.name for c in columns]
        decimal_handling = options.get("decimal_handling", "precise")
        consumer = Consumer(consumer_config(options))
        topic = options["topic"]
        try:
            consumer.assign([TopicPartition(topic, partition.partition, partition.start)])
            next_offset = partition.start
            while next_offset < partition.end:
                messages = consumer.consume(min(CONSUME_BATCH, partition.end - next_offset), timeout=10.0)
                if not messages:
                    raise RuntimeError(
                        f"{topic}[{partition.partition}]: no record at offset {next_offset} within 10 s "
                        f"(range ends at {partition.end}); was it deleted by retention?"
                    )
                for msg in messages:
                    if msg.error():
                        raise RuntimeError(f"{topic}[{partition.partition}]: {msg.error()}")
                    offset = msg.offset()
                    assert offset is not None  # set on every consumed record
                    if offset >= partition.end:
                        return
                    next_offset = offset + 1
                    yield _row(
                        partition.partition,
                        offset,
                        msg.timestamp(),
                        msg.key(),
                        msg.value(),
                        columns,
                        names,
                        decimal_handling,
                    )
        finally:
            consumer.close()


def consumer_config(options: dict[str, str]) -> dict[str, Any]:
    """The worker's librdkafka config: the options as configured (TLS/SASL included), and
    secrets read from the worker's environment, so they never travel in Spark's plan."""
    config: dict[str, Any] = json.loads(options["client_config"])
    for key, env_var in json.loads(options.get("secret_options_env", "{}")).items():
        config[key] = os.environ[env_var]
    config.update({"group.id": "cdc_platform_changelog", "enable.auto.commit": False, "auto.offset.reset": "error"})
    return config


def _arrow_batch(pa: Any, schema: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=f.type) for values, f in zip(columns, schema, strict=True)], schema=schema
    )


def _row(
    partition: int,
    offset: int,
    timestamp: tuple[int, int],
    key: bytes | None,
    value: bytes | None,
    columns: list[LakeColumnSpec],
    names: list[str],
    decimal_handling: str,
) -> tuple[Any, ...]:
    kafka_ts = datetime.fromtimestamp(timestamp[1] / 1000, UTC) if timestamp[0] else None
    try:
        change = decode_record(key, value, columns, decimal_handling)
    except ChangeDecodeError as exc:
        key_text = key.decode(errors="replace") if key is not None else None
        return (
            partition,
            offset,
            kafka_ts,
            None,
            False,
            None,
            None,
            None,
            None,
            key_text,
            None,
            None,
            None,
            str(exc),
            key,
            value,
        )

    def image(values: dict[str, Any] | None) -> tuple[Any, ...] | None:
        return None if values is None else tuple(values.get(n) for n in names)

    return (
        partition,
        offset,
        kafka_ts,
        change.op,
        change.is_tombstone,
        change.commit_lsn,
        change.lsn,
        change.tx_id,
        change.source_ts,
        json.dumps(change.key, default=str, separators=(",", ":")) if change.key is not None else None,
        image(change.before),
        image(change.after),
        change.unavailable,
        None,
        None,
        None,
    )
