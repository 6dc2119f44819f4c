"""Kafka: the one client factory (every consumer, producer and admin client is built here),
offsets and topics."""

from cdc_platform.kafka.clients import KafkaClients, PartitionFacts

__all__ = ["KafkaClients", "PartitionFacts"]
