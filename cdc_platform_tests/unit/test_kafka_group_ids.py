"""Every Kafka consumer of the platform is in a ``cdc_platform.<purpose>`` group, so one
ACL prefix authorizes them all (kafka/clients.py). Spark's Kafka source named a new
``spark-kafka-relation-<uuid>`` group per micro-batch: outside that prefix, and its pooled
consumers were never reused."""

from __future__ import annotations

from cdc_platform.config.model import KafkaConfig
from cdc_platform.kafka.clients import CHANGELOG_GROUP_ID
from cdc_platform.lake.jvm_decode import kafka_source_options


def test_the_changelog_reads_of_spark_and_of_python_share_the_platforms_group() -> None:
    options = kafka_source_options(
        KafkaConfig(bootstrap_servers="127.0.0.1:9092"), "shop.public.orders", [(0, 10, 20), (1, 0, 5)]
    )
    assert options["kafka.group.id"] == CHANGELOG_GROUP_ID
    assert CHANGELOG_GROUP_ID.startswith("cdc_platform.")
    assert "groupIdPrefix" not in options  # ignored by Spark once a group id is set
