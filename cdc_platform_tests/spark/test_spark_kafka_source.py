"""Spark's own Kafka source is on the platform's classpath (issue 16's apply reads topics
with it): an exact offset range of a real multi-partition topic reads, in the JVM, the
same records confluent-kafka reads — partition, offset, key, value and timestamp."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.devtools.stack.kafka import KAFKA_PASSWORD_ENV, KAFKA_SASL_USER, keytool
from cdc_platform.devtools.stack.profiles import StackProfile

pytestmark = [pytest.mark.integration, pytest.mark.spark_codegen]


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        future.result(30)


def _table(topic: str, decoder: str) -> Any:
    from cdc_platform.config.model import TableConfig
    from cdc_platform.envelope.encoding import ValueEncoding
    from cdc_platform.lake.tables import LakeTable

    return LakeTable(TableConfig(name="shop.public.things"), "/unused", topic, ValueEncoding(), decoder=decoder)


def _decoded(spark: Any, kafka: Any, topic: str, spans: list[tuple[int, int, int]], decoder: str) -> Any:
    """The change rows of ``spans`` as the changelog's reader gives them with ``decoder``."""
    from cdc_platform.lake.changelog import read_offsets
    from cdc_platform_tests.cases.envelopes import SCHEMA

    return read_offsets(spark, kafka, _table(topic, decoder), spans, SCHEMA)


def _produce(bootstrap: str, topic: str, count: int) -> None:
    _create_topic(bootstrap, topic, 3)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        value = None if i % 50 == 7 else json.dumps({"i": i, "text": "é✓" * (i % 5)}).encode()
        producer.produce(topic, key=json.dumps({"id": i % 40}).encode(), value=value)
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]]) -> set[tuple[Any, ...]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
    want = sum(end - start for start, end in ranges.values())
    records: set[tuple[Any, ...]] = set()
    while len(records) < want:
        message = consumer.poll(10)
        assert message is not None, f"{len(records)} of {want} records consumed"
        assert message.error() is None, message.error()
        partition, offset = message.partition(), message.offset()
        if offset < ranges[partition][1]:
            records.add((partition, offset, message.key(), message.value(), message.timestamp()[1]))
    consumer.close()
    return records


def test_an_offset_range_reads_the_same_in_the_jvm_as_with_confluent_kafka(stack: StackProfile, spark: Any) -> None:
    topic = f"spark-source-{uuid.uuid4().hex[:8]}"
    _produce(stack.kafka_bootstrap, topic, 600)
    admin = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    ends = {p: admin.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)}
    admin.close()
    # a window's ranges: from 10 into each partition to 5 before its end
    ranges = {p: (10, end - 5) for p, end in ends.items()}
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", stack.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {str(p): s for p, (s, _) in ranges.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, (_, e) in ranges.items()}}))
        .load()
    )
    rows = frame.selectExpr("partition", "offset", "key", "value", "unix_millis(timestamp) AS ts").collect()
    in_jvm = {(r["partition"], r["offset"], bytes(r["key"]), r["value"] and bytes(r["value"]), r["ts"]) for r in rows}
    assert len(rows) == len(in_jvm) == sum(e - s for s, e in ranges.values())
    assert in_jvm == _consume(stack.kafka_bootstrap, topic, ranges)
    assert any(value is None for _, _, _, value, _ in in_jvm)  # tombstones arrive as NULL values


def test_a_topics_change_events_decode_the_same_through_spark_sql_as_through_python_workers(
    stack: StackProfile, spark: Any
) -> None:
    """The changelog's reader end to end on a real topic: Spark's Kafka source and Spark SQL
    (``apply.decoder: jvm``) give exactly the rows the Python data source gives, for the
    platform's, Debezium's and malformed envelopes spread over three partitions."""
    from cdc_platform.config.model import KafkaConfig
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform_tests.cases.envelopes import debezium_records, platform_records

    topic = f"decode-{uuid.uuid4().hex[:8]}"
    _create_topic(stack.kafka_bootstrap, topic, 3)
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True})
    records = platform_records() + debezium_records()[0]
    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=i % 3)
    assert producer.flush(30) == 0
    kafka = KafkaClients(KafkaConfig(bootstrap_servers=stack.kafka_bootstrap))
    ends = kafka.end_offsets(topic)
    spans = [(p, 0, end) for p, end in ends.items()]

    in_jvm, in_python = (_decoded(spark, kafka, topic, spans, d) for d in ("jvm", "python"))
    assert in_jvm.count() == in_python.count() == len(records)
    assert in_jvm.exceptAll(in_python).count() == in_python.exceptAll(in_jvm).count() == 0
    assert in_python.where("error IS NULL AND op = 'c'").count() >= 10


def test_records_of_an_aborted_transaction_are_read_by_neither_decoder(stack: StackProfile, spark: Any) -> None:
    """A transactional producer (Kafka Connect's exactly-once source support, a Debezium
    connector on it) leaves aborted records in the log. A consumer reading committed data
    never sees them; Spark's Java client reads uncommitted unless told, and would apply
    changes the source never made. Both decoders read the committed records only."""
    from cdc_platform.config.model import KafkaConfig
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform_tests.cases.envelopes import platform_records

    topic = f"aborted-{uuid.uuid4().hex[:8]}"
    _create_topic(stack.kafka_bootstrap, topic, 2)
    records = platform_records()
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"t-{topic}"})
    producer.init_transactions(30)
    for commit in (True, False, True):
        producer.begin_transaction()
        for i, (key, value) in enumerate(records):
            producer.produce(topic, key=key, value=value, partition=i % 2)
        producer.flush(30)  # in the log before the abort: the aborted records are there to be read
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    kafka = KafkaClients(KafkaConfig(bootstrap_servers=stack.kafka_bootstrap))
    # every record and a marker per partition per transaction; a commit returns before its
    # markers are written, and until then the last transaction is not yet readable
    every_offset, deadline = 3 * len(records) + 3 * 2, time.monotonic() + 30
    while sum((ends := kafka.end_offsets(topic)).values()) < every_offset and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sum(ends.values()) == every_offset
    spans = [(p, 0, end) for p, end in ends.items()]

    in_jvm, in_python = (_decoded(spark, kafka, topic, spans, d) for d in ("jvm", "python"))
    assert in_python.count() == 2 * len(records)
    assert in_jvm.count() == 2 * len(records)
    assert in_jvm.exceptAll(in_python).count() == in_python.exceptAll(in_jvm).count() == 0


def _sasl(stack: StackProfile, user: str = KAFKA_SASL_USER, ca_file: Path | None = None) -> Any:
    """The stack's authenticating listener in librdkafka's names, the password by env var."""
    from cdc_platform.config.model import KafkaConfig

    return KafkaConfig(
        bootstrap_servers=stack.kafka_sasl_bootstrap,
        options={
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(ca_file or stack.kafka_ca_file),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
        },
        secret_options_env={"sasl.password": KAFKA_PASSWORD_ENV},
    )


def test_a_cluster_that_authenticates_is_read_in_the_jvm_with_the_password_from_the_environment(
    stack: StackProfile, spark: Any, tmp_path: Path
) -> None:
    """Production clusters speak TLS and authenticate their clients. With SASL_SSL/SCRAM and
    a CA file written as for librdkafka and the password in an environment variable, ``decoder: auto`` still reads
    with Spark's Kafka source: the same rows as the Python reader, no password in Spark's
    options. A user the cluster refuses, or a CA that did not sign the broker's certificate,
    fails the table as fatal, naming the fix (retrying cannot help)."""
    from cdc_platform.config.model import KafkaConfig
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform.lake.changelog import decodes_in_jvm
    from cdc_platform.lake.errors import classify_spark_error
    from cdc_platform.lake.jvm_decode import kafka_source_options
    from cdc_platform.model.errors import FatalError
    from cdc_platform_tests.cases.envelopes import platform_records

    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    _create_topic(stack.kafka_bootstrap, topic, 2)
    records = platform_records()
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True})
    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=i % 2)
    assert producer.flush(30) == 0
    secured = _sasl(stack)
    kafka = KafkaClients(secured)
    spans = [(p, 0, end) for p, end in kafka.end_offsets(topic).items()]  # librdkafka through SASL
    assert decodes_in_jvm(_table(topic, "auto"), secured)
    in_jvm, in_python = (_decoded(spark, kafka, topic, spans, d) for d in ("auto", "python"))
    assert in_jvm.count() == in_python.count() == len(records)
    assert in_jvm.exceptAll(in_python).count() == in_python.exceptAll(in_jvm).count() == 0
    # the same partitions through the plain listener, in the same application: Spark pools its
    # consumers by group and partition and refuses one with other settings, so each cluster
    # setting reads in a group of its own (a source moved to TLS, two listeners, a bench)
    plain = _decoded(spark, KafkaClients(KafkaConfig(bootstrap_servers=stack.kafka_bootstrap)), topic, spans, "jvm")
    assert plain.exceptAll(in_python).count() == in_python.exceptAll(plain).count() == 0
    options = json.dumps(kafka_source_options(secured, topic, spans))
    assert os.environ[KAFKA_PASSWORD_ENV] not in options and "${env:" + KAFKA_PASSWORD_ENV + "}" in options

    stranger, other_ca = _sasl(stack, user="nobody"), _sasl(stack, ca_file=_another_ca(tmp_path))
    for refused_by, fix in ((stranger, "Kafka refused the client's credentials"), (other_ca, "TLS handshake")):
        with pytest.raises(Exception) as refused:
            _decoded(spark, KafkaClients(refused_by), topic, spans, "jvm").count()
        error = classify_spark_error(refused.value, "stream apply of shop.public.things")
        assert isinstance(error, FatalError) and fix in str(error), error


def _another_ca(directory: Path) -> Path:
    """A CA certificate that did not sign the broker's (the JDK's keytool, as the stack's)."""
    store, pem = directory / "other.p12", directory / "other.pem"
    for step in (["-genkeypair", "-alias", "o", "-keyalg", "RSA", "-dname", "CN=other"], ["-exportcert", "-rfc",
                 "-alias", "o", "-file", str(pem)]):  # fmt: skip
        subprocess.run([keytool(), *step, "-keystore", str(store), "-storepass", "unused"], check=True,
                       capture_output=True)  # fmt: skip
    return pem
