"""A broker answering "not leader" (a new topic's leader still being elected, a broker
restarting) is asked again with backoff before the platform gives up: a snapshot planned
right after its topic was created failed on it under load (kafka/clients.py). Errors that
waiting cannot fix are not retried; a missing authorization is fatal and names the fix.
The broker is stood in for by an admin client that answers from a script; the real
broker's side is the integration suite's (``integration/test_stack.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_platform.config.model import KafkaConfig
from cdc_platform.kafka import clients
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import FatalError, RetriableError


class _Answer:
    """A future: ``value`` or, for an error code, a ``KafkaException``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        if isinstance(self.value, int):
            raise KafkaException(KafkaError(self.value))
        return self.value


class _Partition:
    def __init__(self, partition: int) -> None:
        self.id = partition


class _Described:
    def __init__(self, partitions: int) -> None:
        self.partitions = [_Partition(p) for p in reversed(range(partitions))]  # any order: answers sort them


class _Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class ScriptedAdmin:
    """Topic ``t`` has two partitions, topic ``gone`` none; each ``list_offsets`` call takes
    the next of ``answers``: an error code (every partition's future raises it), or offsets
    by partition."""

    def __init__(self, answers: list[Any], topics: dict[str, Any]) -> None:
        self.answers, self.topics = answers, topics

    def list_topics(self, timeout: float) -> Any:  # a new kept client's first question
        return type("Metadata", (), {"topics": self.topics})()

    def describe_topics(self, collection: Any, request_timeout: float) -> dict[str, _Answer]:
        return {t: _Answer(self.topics[t]) for t in collection.topic_names}

    def list_offsets(self, asked: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, _Answer]:
        answer = self.answers.pop(0)
        return {tp: _Answer(answer if isinstance(answer, int) else _Offset(answer[tp.partition])) for tp in asked}


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> tuple[KafkaClients, list[Any], list[float], list[ScriptedAdmin]]:
    answers: list[Any] = []
    sleeps: list[float] = []
    made: list[ScriptedAdmin] = []
    topics = {
        "t": _Described(2),
        "gone": KafkaError.UNKNOWN_TOPIC_OR_PART,
        "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }

    def admin() -> ScriptedAdmin:
        made.append(ScriptedAdmin(answers, topics))
        return made[-1]

    kafka = KafkaClients(KafkaConfig(bootstrap_servers="127.0.0.1:9"))
    monkeypatch.setattr(kafka, "admin", admin)
    monkeypatch.setattr(clients.time, "sleep", sleeps.append)
    return kafka, answers, sleeps, made


Scripted = tuple[KafkaClients, list[Any], list[float], list[ScriptedAdmin]]


def test_not_leader_is_asked_again_with_backoff(kafka: Scripted) -> None:
    client, answers, sleeps, _ = kafka
    # each attempt asks for the earliest and the end offsets
    answers += [KafkaError.NOT_LEADER_FOR_PARTITION] * 2 + [KafkaError.LEADER_NOT_AVAILABLE] * 2
    answers += [{0: 0, 1: 2}, {0: 5, 1: 7}]
    assert client.watermarks("t") == {0: (0, 5), 1: (2, 7)}
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0  # backoff grows


def test_several_topics_are_answered_in_one_round_and_a_missing_one_is_empty(kafka: Scripted) -> None:
    client, answers, sleeps, made = kafka
    answers += [{0: 1, 1: 2}, {0: 3, 1: 4}]
    assert client.watermarks_of(["t", "gone", "t"]) == {"t": {0: (1, 3), 1: (2, 4)}, "gone": {}}
    assert answers == [] and sleeps == []  # one earliest and one end request for every topic at once
    answers += [{0: 1, 1: 2}, {0: 3, 1: 9}]
    assert client.end_offsets("t") == {0: 3, 1: 9}
    assert len(made) == 1  # the client is kept between questions


def test_an_error_waiting_cannot_fix_is_not_retried_and_the_client_is_replaced(kafka: Scripted) -> None:
    client, answers, sleeps, made = kafka
    answers += [KafkaError._TRANSPORT, {0: 5, 1: 5}]
    with pytest.raises(RetriableError, match="did not answer"):
        client.end_offsets("t")
    assert sleeps == []
    answers.clear()
    answers += [{0: 0, 1: 0}, {0: 5, 1: 6}]
    assert client.end_offsets("t") == {0: 5, 1: 6}
    assert len(made) == 2  # a client that failed is not asked again


def test_a_topic_the_platform_may_not_describe_is_fatal_and_names_the_fix(kafka: Scripted) -> None:
    client, _, sleeps, _ = kafka
    with pytest.raises(FatalError, match="grant the platform's principal DESCRIBE"):
        client.watermarks("secret")
    assert sleeps == []


def test_a_leader_that_never_comes_is_still_a_retriable_error(kafka: Scripted) -> None:
    client, answers, sleeps, _ = kafka
    answers += [KafkaError.NOT_LEADER_FOR_PARTITION] * 50
    with pytest.raises(RetriableError, match=r"Not leader|NOT_LEADER"):
        client.end_offsets("t")
    assert 0 < len(sleeps) < 50 and sum(sleeps) < 30  # bounded: the caller's own retry takes over


@pytest.mark.parametrize(
    ("code", "text", "fix"),
    [
        # the broker's answer (SCRAM, then PLAIN), as librdkafka hands it to error_cb
        (KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed during authentication "
         "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 310ms in state AUTH_REQ)",
         r"refused the client's credentials.*kafka\.secret_options_env"),
        (KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed: Invalid username or "
         "password (after 2ms in state AUTH_REQ)", r"refused the client's credentials"),
        (KafkaError._SSL, "sasl_ssl://127.0.0.1:9094/bootstrap: SSL handshake failed: error:0A000086:SSL "
         "routines::certificate verify failed: broker certificate could not be verified, verify that "
         "ssl.ca.location is correctly configured (after 4ms in state SSL_HANDSHAKE)",
         r"certificate could not be verified; set kafka\.options ssl\.ca\.location"),
        # a connection lost during a handshake: the same codes, retrying can help
        (KafkaError._AUTHENTICATION, "SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker transport "
         "failure: broker's supported mechanisms: (n/a) (after 0ms in state DOWN)", None),
        (KafkaError._SSL, "SSL handshake failed: Disconnected: connection reset by peer", None),
        (KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure", None),
    ],
)  # fmt: skip
def test_only_the_broker_turning_the_client_away_is_fatal(code: int, text: str, fix: str | None) -> None:
    kafka = KafkaClients(KafkaConfig(bootstrap_servers="127.0.0.1:9"))  # plaintext: no probe
    assert (clients.refusal_fix(KafkaError(code, text)) is None) is (fix is None)
    kafka._on_client_error(KafkaError(code, text))
    if fix is not None:
        with pytest.raises(FatalError, match=fix):
            kafka.raise_if_refused()
        assert isinstance(kafka.unreachable("no answer"), FatalError)
    else:
        kafka.raise_if_refused()
        assert isinstance(kafka.unreachable("no answer"), RetriableError)


def test_a_refusal_is_forgotten_once_kafka_answers_again(kafka: Scripted) -> None:
    """A long-running process (the Dagster daemon's sensors) keeps its clients: once the
    operator fixed the cluster's side (created the user, say), a question Kafka answers
    clears the refusal instead of failing the process forever."""
    clients_, answers, _, _ = kafka
    clients_._on_client_error(
        KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed")
    )
    with pytest.raises(FatalError):
        clients_.raise_if_refused()
    answers += [{0: 1, 1: 2}, {0: 7, 1: 9}]  # earliest, end
    assert clients_.end_offsets("t") == {0: 7, 1: 9}
    clients_.raise_if_refused()
