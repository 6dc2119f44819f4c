"""The offsets the platform plans from are what a consumer can read: the kept admin client's
batched answer (``KafkaClients.watermarks_of``) equals each partition's watermarks as a
consumer asks for them, for topics with records, an empty one, one whose head was
deleted, one with a transaction open and then aborted, and a missing one."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.config.model import KafkaConfig
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.kafka.clients import KafkaClients

pytestmark = pytest.mark.integration


def consumer_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """Each partition asked as a (read_committed) consumer asks: how the platform asked before."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-test", "enable.auto.commit": False})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15) for p in range(partitions)}
    finally:
        consumer.close()


def test_batched_watermarks_are_what_a_consumer_can_read(stack: StackProfile) -> None:
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:8]
    spread, empty, trimmed, open_tx = (f"offsets-{run}-{name}" for name in ("spread", "empty", "trimmed", "tx"))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(spread, num_partitions=3, replication_factor=1)]
        + [NewTopic(t, num_partitions=1, replication_factor=1) for t in (empty, trimmed, open_tx)]
    )
    for future in created.values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(30):
        producer.produce(spread, key=f"k{i}".encode(), value=b"v")
    for i in range(10):
        producer.produce(trimmed, key=f"k{i}".encode(), value=b"v")
    assert producer.flush(30) == 0
    admin.delete_records([TopicPartition(trimmed, 0, 4)])[TopicPartition(trimmed, 0, 4)].result(timeout=30)
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"offsets-{run}"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(5):
        transactional.produce(open_tx, key=f"k{i}".encode(), value=b"committed")
    transactional.commit_transaction(30)  # records 0-4, its marker at 5
    transactional.begin_transaction()
    for i in range(3):
        transactional.produce(open_tx, key=f"k{i}".encode(), value=b"open")
    assert transactional.flush(30) == 0  # written, not committed: a consumer cannot read them yet

    kafka = KafkaClients(KafkaConfig(bootstrap_servers=bootstrap))
    asked = [spread, empty, trimmed, open_tx, f"offsets-{run}-missing"]
    marks = kafka.watermarks_of(asked)
    assert list(marks) == asked
    assert sum(high - low for low, high in marks[spread].values()) == 30
    assert marks[empty] == {0: (0, 0)}
    assert marks[trimmed] == {0: (4, 10)}
    assert marks[open_tx] == {0: (0, 6)}  # ends where the open transaction starts
    assert marks[f"offsets-{run}-missing"] == {}
    for topic, partitions in ((spread, 3), (empty, 1), (trimmed, 1), (open_tx, 1)):
        assert marks[topic] == consumer_watermarks(bootstrap, topic, partitions), topic
        assert kafka.watermarks(topic) == marks[topic]  # one topic asked alone: the same answer

    transactional.abort_transaction(30)  # records 6-8 aborted, the marker at 9
    deadline = time.monotonic() + 30  # the coordinator writes the marker after the abort returns
    while kafka.watermarks(open_tx) != {0: (0, 10)} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kafka.watermarks(open_tx) == {0: (0, 10)} == consumer_watermarks(bootstrap, open_tx, 1)
    admin.delete_topics([spread, empty, trimmed, open_tx])
