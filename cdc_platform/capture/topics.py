"""Kafka topics and producer settings shared by every capture (log-based and polling)."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # where it is defined (confluent_kafka.admin re-exports it untyped)

from cdc_platform.capture.errors import FatalCaptureError, RetriableCaptureError
from cdc_platform.config import KafkaConfig

log = logging.getLogger("cdc_platform.capture")


def producer_config(kafka: KafkaConfig) -> dict[str, Any]:
    return {
        **kafka.client_config(),
        "enable.idempotence": True,  # no duplicates or reordering from producer retries
        "acks": "all",
        "partitioner": "murmur2_random",  # Java-compatible: every client agrees on a key's partition
        "linger.ms": 20,
        "compression.type": "lz4",
        "message.timeout.ms": 120_000,
    }


def ensure_topics(kafka: KafkaConfig, data_topics: list[str], single_partition_compacted: list[str]) -> None:
    """Create missing topics: change topics with the configured partitions and cleanup
    policy; bookkeeping topics (heartbeats, stored cursors) compacted with one partition."""
    admin = AdminClient(kafka.client_config())
    try:
        existing = set(admin.list_topics(timeout=15).topics)
    except KafkaException as exc:
        raise RetriableCaptureError(f"Kafka unreachable at {kafka.bootstrap_servers}: {exc}") from None
    wanted = [
        NewTopic(
            topic,
            num_partitions=kafka.partitions,
            replication_factor=kafka.replication_factor,
            config={"cleanup.policy": kafka.cleanup_policy},
        )
        for topic in sorted(set(data_topics))
        if topic not in existing
    ]
    wanted += [
        NewTopic(
            topic, num_partitions=1, replication_factor=kafka.replication_factor, config={"cleanup.policy": "compact"}
        )
        for topic in sorted(set(single_partition_compacted))
        if topic not in existing
    ]
    if not wanted:
        return
    for topic, future in admin.create_topics(wanted, request_timeout=30).items():
        try:
            future.result(timeout=60)
            log.info("created topic %s", topic)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise FatalCaptureError(
                    f"not authorized to create Kafka topic {topic}; create it or grant ACLs"
                ) from None
            raise RetriableCaptureError(f"creating Kafka topic {topic} failed: {exc}") from None
