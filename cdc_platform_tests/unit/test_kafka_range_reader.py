"""The Python reader's consumer loop (``kafka_source.records_in_range``) against a consumer
that behaves as librdkafka's does: ``consume(n, timeout)`` returns at once when ``n``
messages are there and otherwise after ``timeout`` with what there is; with
``enable.partition.eof`` the partition's end arrives as a message of its own. Offsets that
hold no record (transaction markers, aborted records, compacted records) are skipped by
the broker. A real broker's transactions: ``spark/test_spark_kafka_source.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaError, TopicPartition

from cdc_platform.lake.kafka_source import CONSUME_TIMEOUT_S, KafkaRange, records_in_range


@dataclass
class Message:
    _offset: int
    _error: KafkaError | None = None

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset


@dataclass
class ScriptedConsumer:
    """A partition whose readable records are ``records`` (offsets) and whose end (the last
    stable offset) is ``end``; time passes only while ``consume`` waits."""

    records: list[int]
    end: int
    now: float = 0.0
    position: int = 0
    waits: list[float] = field(default_factory=list)
    eof_sent: bool = False

    def clock(self) -> float:
        return self.now

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.position = partitions[0].offset

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        out = [Message(o) for o in self.records if o >= self.position][:num_messages]
        if out:
            self.position = out[-1].offset() + 1
        if len(out) < num_messages and not self.eof_sent and not [o for o in self.records if o >= self.position]:
            self.position, self.eof_sent = self.end, True
            out.append(Message(self.end, KafkaError(KafkaError._PARTITION_EOF)))
        if len(out) < num_messages:  # librdkafka waits for a full batch until the timeout
            self.now += timeout
            self.waits.append(timeout)
        return out


def read(consumer: ScriptedConsumer, start: int, end: int) -> list[int]:
    part = KafkaRange(0, start, end)
    return [offset for _, offset, _, _, _ in records_in_range(consumer, "t", part, clock=consumer.clock)]


def test_a_range_ending_in_transaction_markers_ends_at_the_partition_end_without_waiting_out_the_timeout() -> None:
    # two committed transactions (markers at 3 and 8) around an aborted one (4-6, marker 7)
    consumer = ScriptedConsumer(records=[0, 1, 2, 9, 10], end=12)
    assert read(consumer, 0, 12) == [0, 1, 2, 9, 10]
    assert consumer.now < 1.0, consumer.waits  # a batch end every stream batch of the topic pays


def test_a_range_ending_before_the_partition_end_stops_at_the_first_record_past_it() -> None:
    consumer = ScriptedConsumer(records=[0, 1, 2, 9, 10], end=12)
    assert read(consumer, 1, 8) == [1, 2]  # 3-7 hold no record; 9 is past the range
    assert consumer.now < 1.0, consumer.waits


def test_a_range_whose_records_never_come_fails_naming_the_offset() -> None:
    consumer = ScriptedConsumer(records=[], end=0)  # retention deleted them; the end moved back
    consumer.eof_sent = True
    with pytest.raises(RuntimeError, match=r"t\[0\]: no record at offset 5 .*retention"):
        read(consumer, 5, 9)
    assert consumer.now >= CONSUME_TIMEOUT_S
