"""A Spark Python data source reading fixed Kafka offset ranges, decoded into change rows.

The changelog needs exact, recorded offset ranges per window. This source reads
``[start, end)`` of each Kafka partition in Spark tasks (long ranges are cut into
several, so every core decodes), with confluent-kafka, and decodes each record in the
Python worker with ``cdc_platform.envelope.changes`` — the same code the tests check
against Debezium's documented events. Undecodable records come out with ``error`` set
and their raw bytes, for the dead-letter table; fields the table's registered schema
does not know come out in ``unknown_columns`` (a schema change to register).

Options (strings): ``topic``, ``ranges`` (JSON ``[[partition, start, end], …]``),
``schema`` (the table's ``TableSchema`` JSON), ``client_config`` and
``secret_options_env`` (``kafka.clients.worker_options``: secrets are read in the worker
by name, never in Spark's plan), ``encoding`` (the producer's value representation).

This module runs in Spark's Python workers: it must not import the ledger (delta-rs'
runtime does not survive the workers' fork).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
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

from cdc_platform.envelope.changes import ChangeDecodeError, LakeColumnSpec, decode_record, instant_of_millis
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.kafka.clients import worker_consumer
from cdc_platform.model.tables import TableSchema

SOURCE_NAME = "cdc_kafka_range"
CONSUME_BATCH = 1000
ARROW_BATCH_ROWS = 4096
OFFSETS_PER_TASK = 20_000
# one consume call's wait: librdkafka returns a batch when it is full or this has passed, and
# a range whose last offsets hold no record (transaction markers) never fills its batch
CONSUME_WAIT_S = 0.2
CONSUME_TIMEOUT_S = 10.0  # no record for this long: the range's records are gone


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
            StructField("unknown_columns", ArrayType(StringType(), False), True),
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
        step = int(self.options.get("offsets_per_task", OFFSETS_PER_TASK))
        return [
            KafkaRange(int(p), chunk, min(chunk + step, int(e)))
            for p, s, e in json.loads(self.options["ranges"])
            for chunk in range(int(s), int(e), step)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches when the schema is known (as under Spark): Spark then skips
        its per-value conversion of Python rows, which cost more than decoding them."""
        records = self.decoded(partition)
        if self.schema is None:
            yield from (row for row, _, _ in records)
            return
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")  # exactly what Spark checks against
        batch: list[tuple[tuple[Any, ...], Any, Any]] = []
        for record in records:
            batch.append(record)
            if len(batch) >= ARROW_BATCH_ROWS:
                yield arrow_batch(pa, arrow_schema, batch)
                batch = []
        if batch:
            yield arrow_batch(pa, arrow_schema, batch)

    def decoded(self, partition: InputPartition) -> Iterator[tuple[tuple[Any, ...], Any, Any]]:
        """(change row, raw key, raw value) of every record in the partition's range."""
        if not isinstance(partition, KafkaRange):  # no ranges: Spark reads one empty placeholder
            return
        options = self.options
        schema = TableSchema.from_json(options["schema"])
        columns = [LakeColumnSpec(c.name, c.pgtype, c.typmod, c.dims) for c in schema.columns]
        encoding = ValueEncoding.from_option(options.get("encoding"))
        for partition_no, offset, timestamp, key, value in consume_range(options, options["topic"], partition):
            yield _row(partition_no, offset, timestamp, key, value, columns, encoding), key, value


def consume_range(options: dict[str, str], topic: str, part: KafkaRange) -> Iterator[tuple[int, int, Any, Any, Any]]:
    """(partition, offset, timestamp, key, value) of every record in ``[start, end)``."""
    consumer = worker_consumer(options)
    try:
        yield from records_in_range(consumer, topic, part)
    finally:
        consumer.close()


def records_in_range(
    consumer: Any, topic: str, part: KafkaRange, clock: Callable[[], float] = time.monotonic
) -> Iterator[tuple[int, int, Any, Any, Any]]:
    """The records of ``[start, end)`` read by an open consumer (``worker_consumer``)."""
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, part.partition, part.start)])
    next_offset, last_progress = part.start, clock()
    while next_offset < part.end:
        messages = consumer.consume(min(CONSUME_BATCH, part.end - next_offset), timeout=CONSUME_WAIT_S)
        if not messages:
            if clock() - last_progress >= CONSUME_TIMEOUT_S:
                raise RuntimeError(
                    f"{topic}[{part.partition}]: no record at offset {next_offset} within {CONSUME_TIMEOUT_S:.0f} s "
                    f"(range ends at {part.end}); was it deleted by retention?"
                )
            continue
        last_progress = clock()
        for msg in messages:
            at_end = _ends_partition(msg)
            if msg.error() and not at_end:
                raise RuntimeError(f"{topic}[{part.partition}]: {msg.error()}")
            offset = msg.offset()
            assert offset is not None  # set on every consumed record and partition end
            if offset >= part.end:  # a record past the range, or the partition's end at or past it
                return
            if at_end:  # the end before the range's: records are still to come
                continue
            next_offset = offset + 1
            yield part.partition, offset, msg.timestamp(), msg.key(), msg.value()


def _ends_partition(msg: Any) -> bool:
    """Whether a consumed message is the partition's end (``enable.partition.eof``)."""
    from confluent_kafka import KafkaError

    error = msg.error()
    return error is not None and error.code() == KafkaError._PARTITION_EOF


def arrow_batch(pa: Any, schema: Any, records: list[tuple[tuple[Any, ...], Any, Any]]) -> Any:
    """One record batch of change rows. A row with a value Arrow cannot put in its lake
    type (a value the decoder let through) becomes an error row, a dead letter with the
    reason, instead of failing the Spark task and with it every later window."""
    try:
        return _batch(pa, schema, [row for row, _, _ in records])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        rows = []
        for row, key, value in records:
            try:
                _batch(pa, schema, [row])
                rows.append(row)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                rows.append(
                    _error_row(row[0], row[1], row[2], key, value, f"a value does not fit the lake type: {exc}")
                )
        return _batch(pa, schema, rows)


def _batch(pa: Any, schema: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=f.type) for values, f in zip(columns, schema, strict=True)], schema=schema
    )


def _error_row(
    partition: int, offset: int, kafka_ts: datetime | None, key: bytes | None, value: bytes | None, reason: str
) -> tuple[Any, ...]:
    key_text = key.decode(errors="replace") if key is not None else None
    return (partition, offset, kafka_ts, None, False, None, None, None, None, key_text, None, None, None, None,
            reason, key, value)  # fmt: skip


def _row(
    partition: int, offset: int, timestamp: tuple[int, int], key: bytes | None, value: bytes | None,
    columns: list[LakeColumnSpec], encoding: ValueEncoding,
) -> tuple[Any, ...]:  # fmt: skip
    kafka_ts = instant_of_millis(timestamp[1]) if timestamp[0] else None
    try:
        change = decode_record(key, value, columns, encoding)
    except ChangeDecodeError as exc:
        return _error_row(partition, offset, kafka_ts, key, value, str(exc))
    names = [c.name for c in columns]

    def image(values: dict[str, Any] | None) -> tuple[Any, ...] | None:
        return None if values is None else tuple(values.get(n) for n in names)

    key_json = json.dumps(change.key, default=str, separators=(",", ":")) if change.key is not None else None
    return (
        partition, offset, kafka_ts, change.op, change.is_tombstone, change.commit_lsn, change.lsn, change.tx_id,
        change.source_ts, key_json, image(change.before), image(change.after), change.unavailable,
        change.unknown or None, None, None, None,
    )  # fmt: skip


def decode_mixed_batches(
    batches: Iterator[Any], schema_json: str, encoding_option: str, out_schema_json: str
) -> Iterator[Any]:
    """Arrow batches of change rows where ``__jvm`` is true (decoded by ``lake.jvm_decode``,
    passed through) and of raw Kafka records where it is false or absent (decoded here by
    the Python decoder, error rows included)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = TableSchema.from_json(schema_json)
    columns = [LakeColumnSpec(c.name, c.pgtype, c.typmod, c.dims) for c in schema.columns]
    encoding = ValueEncoding.from_option(encoding_option)
    arrow_schema = to_arrow_schema(StructType.fromJson(json.loads(out_schema_json)), timezone="UTC")
    for batch in batches:
        if batch.num_rows == 0:
            continue
        in_jvm = batch.column("__jvm") if "__jvm" in batch.schema.names else pa.nulls(batch.num_rows, pa.bool_())
        in_jvm = pc.fill_null(in_jvm, False)
        passed = batch.filter(in_jvm)
        if passed.num_rows:
            yield pa.RecordBatch.from_arrays([passed.column(f.name) for f in arrow_schema], schema=arrow_schema)
        rest = batch.filter(pc.invert(in_jvm))
        if rest.num_rows:
            yield _decoded_batch(pa, pc, rest, columns, encoding, arrow_schema)


def _decoded_batch(pa: Any, pc: Any, batch: Any, columns: list[LakeColumnSpec], encoding: ValueEncoding,
                   arrow_schema: Any) -> Any:  # fmt: skip
    millis = pc.divide(pc.cast(batch.column("timestamp"), pa.int64()), 1000).to_pylist()
    records = [
        (_row(part, offset, (int(kind is not None and kind >= 0), ms or 0), key, value, columns, encoding), key, value)
        for part, offset, ms, kind, key, value in zip(
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            millis,
            batch.column("timestampType").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        )
    ]
    return arrow_batch(pa, arrow_schema, records)
