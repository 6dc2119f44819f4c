"""Every Kafka consumer of the platform is in a ``cdc_platform.<purpose>`` group, so one
ACL prefix authorizes them all (kafka/clients.py). Spark's Kafka source named a new
``spark-kafka-relation-<uuid>`` group per micro-batch: outside that prefix, and its pooled
consumers were never reused."""

from __future__ import annotations

from cdc_platform.config.model import KafkaConfig
from cdc_platform.kafka.clients import CHANGELOG_GROUP_ID
from cdc_platform.lake.jvm_decode import kafka_source_options


def test_the_changelog_reads_of_spark_are_in_the_platforms_group_one_per_connection_setting() -> None:
    """Spark pools its consumers by group and partition and fails a read whose settings
    differ from the pooled consumer's, so each cluster setting gets a group of its own, under
    the platform's prefix and the same for every read (and process) with that setting."""

    def group(kafka: KafkaConfig) -> str:
        return kafka_source_options(kafka, "shop.public.orders", [(0, 10, 20), (1, 0, 5)])["kafka.group.id"]

    plain = KafkaConfig(bootstrap_servers="127.0.0.1:9092")
    secured = KafkaConfig(
        bootstrap_servers="127.0.0.1:9094",
        options={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "cdc"},
        secret_options_env={"sasl.password": "CDC_KAFKA_PASSWORD"},
    )
    assert group(plain) == group(KafkaConfig(bootstrap_servers="127.0.0.1:9092"))
    assert group(plain) != group(secured) != group(KafkaConfig(bootstrap_servers="127.0.0.1:9093"))
    assert all(group(k).startswith(f"{CHANGELOG_GROUP_ID}.") for k in (plain, secured))
    assert CHANGELOG_GROUP_ID.startswith("cdc_platform.")
    options = kafka_source_options(plain, "shop.public.orders", [(0, 10, 20)])
    assert "groupIdPrefix" not in options  # ignored by Spark once a group id is set
