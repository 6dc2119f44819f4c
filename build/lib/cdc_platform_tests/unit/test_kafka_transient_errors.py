"""A broker answering "not leader" (a new topic's leader still being elected, a broker
restarting) is asked again with backoff before the platform gives up: a snapshot planned
right after its topic was created failed on it under load (kafka/clients.py). Errors that
waiting cannot fix are not retried. The brokers are stood in for by a consumer that
answers from a script; the real broker's side is the integration suite's."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_platform.config.model import KafkaConfig
from cdc_platform.kafka import clients
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import RetriableError


class _Topic:
    def __init__(self) -> None:
        self.error = None
        self.partitions = {0: None, 1: None}


class _Metadata:
    def __init__(self) -> None:
        self.topics = {"t": _Topic()}


class ScriptedConsumer:
    """Answers watermark questions from ``answers``: an error code raises, a pair answers."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        return _Metadata()

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return tuple(answer)  # type: ignore[return-value]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> tuple[KafkaClients, list[Any], list[float]]:
    answers: list[Any] = []
    sleeps: list[float] = []
    kafka = KafkaClients(KafkaConfig(bootstrap_servers="127.0.0.1:9"))
    monkeypatch.setattr(kafka, "consumer", lambda purpose, **_: ScriptedConsumer(answers))
    monkeypatch.setattr(clients.time, "sleep", sleeps.append)
    return kafka, answers, sleeps


def test_not_leader_is_asked_again_with_backoff(kafka: tuple[KafkaClients, list[Any], list[float]]) -> None:
    client, answers, sleeps = kafka
    answers += [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (0, 5), (2, 7)]
    assert client.end_offsets("t") == {0: 5, 1: 7}
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0  # backoff grows


def test_an_error_waiting_cannot_fix_is_not_retried(kafka: tuple[KafkaClients, list[Any], list[float]]) -> None:
    client, answers, sleeps = kafka
    answers += [KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 5), (0, 5)]
    with pytest.raises(RetriableError, match="did not answer"):
        client.end_offsets("t")
    assert sleeps == []


def test_a_leader_that_never_comes_is_still_a_retriable_error(
    kafka: tuple[KafkaClients, list[Any], list[float]],
) -> None:
    client, answers, sleeps = kafka
    answers += [KafkaError.NOT_LEADER_FOR_PARTITION] * 50
    with pytest.raises(RetriableError, match=r"Not leader|NOT_LEADER"):
        client.end_offsets("t")
    assert 0 < len(sleeps) < 50 and sum(sleeps) < 30  # bounded: the caller's own retry takes over
