"""The one Kafka client factory, and the offset questions the platform asks Kafka.

Every consumer, producer and admin client of the platform is built here from the
``kafka:`` config (TLS/SASL options included, secrets from the environment), with one
group-id scheme (``cdc_platform.<purpose>``; the platform never commits consumer
offsets: positions live in the ledger). Watermark questions go to one admin client kept
for the ``KafkaClients``' life, many topics in one round (a stream apply asks for every
table it applies, every few seconds: a fresh client per question cost ~50-70 ms of wall
time each, a kept one a few ms for a topic and ~60 ms for 200). Other questions open a
consumer, ask, and close it. A partition whose leader is moving is asked again with
backoff. Other broker trouble is a ``RetriableError``; a missing topic is an empty answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # exported, not in __all__

from cdc_platform.config.model import KafkaConfig
from cdc_platform.model.errors import CdcError, FatalError, RetriableError
from cdc_platform.model.windows import PartitionFacts

TIMEOUT_S = 15.0
# "not the leader" lasts while a new topic's leader is elected or a restarted broker takes
# its partitions back: a few seconds, so 0.25 s doubling over 6 attempts waits up to ~8 s
LEADERSHIP_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
ASK_ATTEMPTS = 6
ASK_FIRST_BACKOFF_S = 0.25
T = TypeVar("T")
EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call]  # the library leaves these untyped
LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]

__all__ = ["KafkaClients", "PartitionFacts", "worker_consumer"]


# the changelog's reads, Python's consumers and Spark's Kafka source alike (nothing committed)
CHANGELOG_GROUP_ID = "cdc_platform.changelog"


def producer_settings() -> dict[str, Any]:
    """How every platform producer writes: idempotent, acks from all replicas, and the
    Java-compatible partitioner so every client agrees on a key's partition."""
    return {
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 20,
        "compression.type": "lz4",
        "message.timeout.ms": 120_000,
    }


PROBE_S = 5.0  # how long a failed question's credential check waits for the broker's answer
LIST_TRY_S = 1.0  # one try at listing topics; the errors a failed try queued are served before the next


CREDENTIALS_FIX = (
    "the broker refused the client's credentials; fix sasl.username in kafka.options or the password in the "
    "environment variable kafka.secret_options_env names, then start again (nothing unacknowledged was lost)"
)
TLS_FIX = (
    "the broker's certificate could not be verified; set kafka.options ssl.ca.location to the CA that signed it "
    "(and check ssl.endpoint.identification.algorithm), then start again"
)


def refusal_fix(error: KafkaError) -> str | None:
    """The fix when the broker turned the client away for good: refused SASL credentials,
    or a certificate the client cannot verify. librdkafka gives these only to
    ``error_cb``; the call that then fails says "transport failure" or "timed out", which
    alone would be retried forever. A connection lost during a handshake has the same
    codes without these words: not a refusal."""
    text = error.str().lower()
    if error.code() == KafkaError._AUTHENTICATION and "authentication failed" in text:
        return CREDENTIALS_FIX
    if error.code() == KafkaError._SSL and "certificate verify failed" in text:
        return TLS_FIX
    return None


class KafkaClients:
    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self._offsets_admin: AdminClient | None = None
        self._offsets_lock = threading.Lock()
        self.refusal: tuple[str, str] | None = None  # the fix and the broker's words, once it turned a client away

    # ------------------------------------------------------------ clients

    def consumer(self, purpose: str, **overrides: Any) -> Consumer:
        settings = {
            **self._client_config(),
            "group.id": f"cdc_platform.{purpose}",
            "enable.auto.commit": False,
            **overrides,
        }
        return Consumer(settings)

    def producer(self, **overrides: Any) -> Producer:
        return Producer({**self._client_config(), **producer_settings(), **overrides})

    def admin(self) -> AdminClient:
        return AdminClient(self._client_config())

    def _client_config(self) -> dict[str, Any]:
        return {**self.kafka.client_config(), "error_cb": self._on_client_error}

    def _on_client_error(self, error: KafkaError) -> None:
        fix = refusal_fix(error)
        if fix is not None:
            self.refusal = (fix, error.str())

    def raise_if_refused(self) -> None:
        """A ``FatalError`` with the fix once any client of these saw the broker turn it away
        (a producer's errors arrive as it is polled or flushed)."""
        if self.refusal is not None:
            fix, words = self.refusal
            raise FatalError(f"Kafka at {self.kafka.bootstrap_servers}: {fix} ({words})")

    def unreachable(self, message: str) -> CdcError:
        """The error for a question Kafka did not answer: fatal when the broker turned the
        client away, else retriable. An admin client or a consumer that is not polled never
        hears why, so on a TLS or SASL connection a short-lived producer asks (it takes the
        same settings)."""
        secured = self.kafka.options.get("security.protocol", "plaintext").upper() != "PLAINTEXT"
        if self.refusal is None and secured:
            probe = self.producer(log_level=0)
            with contextlib.suppress(KafkaException):
                probe.list_topics(timeout=PROBE_S)
            probe.poll(0)  # serves the errors the failed request queued
        try:
            self.raise_if_refused()
        except FatalError as refused:
            return refused
        return RetriableError(message)

    def _ask(self, purpose: str, question: Callable[[Consumer], T]) -> T:
        """``question`` asked of a fresh consumer, with ``_with_backoff``'s retries."""

        def once() -> T:
            consumer = self.consumer(purpose)
            try:
                return question(consumer)
            finally:
                consumer.close()

        return self._with_backoff(purpose, once)

    def _ask_offsets(self, question: Callable[[AdminClient], T]) -> T:
        """``question`` asked of the kept admin client, with ``_with_backoff``'s retries; a
        client that failed is dropped (the next question starts a fresh one), and a topic
        the platform may not describe is fatal."""

        def once() -> T:
            try:
                return question(self._offsets_client())
            except KafkaException as exc:
                if _code(exc) == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise FatalError(
                        f"not authorized to describe a Kafka topic at {self.kafka.bootstrap_servers} ({exc}); "
                        "grant the platform's principal DESCRIBE and READ on its topics"
                    ) from None
                raise

        return self._with_backoff("offsets", once, self._drop_offsets_client)

    def _with_backoff(self, purpose: str, once: Callable[[], T], given_up: Callable[[], None] = lambda: None) -> T:
        """``once`` again with backoff while a broker answers that it is not (yet) the
        partition's leader, which a new topic's election or a broker restart answers for a
        few seconds. Other broker trouble, or a leader that does not come, is a
        ``RetriableError`` for the caller's own retry (after ``given_up``)."""
        delay = ASK_FIRST_BACKOFF_S
        for attempt in range(1, ASK_ATTEMPTS + 1):
            try:
                answer = once()
                self.refusal = None  # answered: whatever turned a client away was fixed
                return answer
            except KafkaException as exc:
                if _code(exc) not in LEADERSHIP_MOVING or attempt == ASK_ATTEMPTS:
                    given_up()
                    raise self.unreachable(
                        f"Kafka at {self.kafka.bootstrap_servers} did not answer ({purpose}): {exc}"
                    ) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _drop_offsets_client(self) -> None:
        with self._offsets_lock:
            self._offsets_admin = None

    def _offsets_client(self) -> AdminClient:
        """The kept admin client; a new one first lists the topics (``_topic_names``), so a
        broker that turns it away is fatal in a second, not after a question's timeout."""
        with self._offsets_lock:
            if self._offsets_admin is None:
                admin = self.admin()
                self._topic_names(admin)
                self._offsets_admin = admin
            return self._offsets_admin

    def _isolation(self) -> IsolationLevel:
        """The consumers' isolation level (librdkafka's default, read_committed, unless the
        ``kafka.options`` set another), so an end offset is what a consumer can read."""
        configured = str(self.kafka.client_config().get("isolation.level", "read_committed"))
        return IsolationLevel.READ_UNCOMMITTED if configured == "read_uncommitted" else IsolationLevel.READ_COMMITTED

    # ------------------------------------------------------------ offsets

    def partitions(self, topic: str) -> list[int] | None:
        """The topic's partitions, or None if it does not exist."""
        return self._ask("metadata", lambda consumer: _partitions(consumer, topic))

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """Partition -> (earliest offset held, end offset); {} for a missing topic."""
        return self.watermarks_of([topic])[topic]

    def watermarks_of(self, topics: Sequence[str]) -> dict[str, dict[int, tuple[int, int]]]:
        """``watermarks`` of several topics in one round: one metadata request, then one
        earliest-offsets and one end-offsets request per broker leading any of them."""
        wanted = list(dict.fromkeys(topics))
        if not wanted:
            return {}
        isolation = self._isolation()
        return self._ask_offsets(lambda admin: _watermarks_of(admin, wanted, isolation))

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: high for p, (_, high) in self.watermarks(topic).items()}

    def earliest_offsets(self, topic: str) -> dict[int, int]:
        return {p: low for p, (low, _) in self.watermarks(topic).items()}

    def offsets_for_time(self, topic: str, partitions: Sequence[int], when: datetime) -> dict[int, int | None]:
        """Per partition, the first offset whose timestamp is at or after ``when`` (None: none yet)."""
        if not partitions:
            return {}
        millis = int(when.timestamp() * 1000)
        wanted = [TopicPartition(topic, p, millis) for p in partitions]
        found = self._ask("offsets", lambda consumer: consumer.offsets_for_times(wanted, timeout=TIMEOUT_S))
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

    def every_partition_past(self, topic: str, when: datetime) -> bool:
        """Every partition of the topic holds a record at or after ``when``."""
        partitions = self.partitions(topic)
        if not partitions:
            return False
        return all(o is not None for o in self.offsets_for_time(topic, partitions, when).values())

    def window_facts(
        self, topic: str, start: datetime, end: datetime, fixed_start: set[int], fixed_end: set[int]
    ) -> dict[int, PartitionFacts]:
        """What planning a window needs per partition; edges fixed by recorded neighbours
        are not looked up by time."""
        marks = self.watermarks(topic)
        if not marks:
            return {}
        at_start = self.offsets_for_time(topic, [p for p in marks if p not in fixed_start], start)
        at_end = self.offsets_for_time(topic, [p for p in marks if p not in fixed_end], end)
        return {p: PartitionFacts(low, high, at_start.get(p), at_end.get(p)) for p, (low, high) in marks.items()}

    def latest_values(self, topic: str, purpose: str, wait_s: float = 60.0) -> dict[bytes, bytes | None]:
        """Key -> newest value of a single-partition compacted topic (heartbeats, stored
        cursors), read from its start to its end."""

        def read(consumer: Consumer) -> dict[bytes, bytes | None]:
            if _partitions(consumer, topic) is None:
                return {}
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
            if high <= low:
                return {}
            consumer.assign([TopicPartition(topic, 0, low)])
            return _read_to(consumer, topic, high, wait_s)

        return self._ask(purpose, read)

    def last_value(self, topic: str, purpose: str) -> bytes | None:
        """The value of the newest record of a single-partition topic (None: none)."""

        def read(consumer: Consumer) -> bytes | None:
            if _partitions(consumer, topic) is None:
                return None
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
            if high <= low:
                return None
            consumer.assign([TopicPartition(topic, 0, high - 1)])
            msg = consumer.poll(TIMEOUT_S)
            return None if msg is None or msg.error() else msg.value()

        return self._ask(purpose, read)

    # ------------------------------------------------------------ topics

    def ensure_topics(self, data_topics: Sequence[str], single_partition_compacted: Sequence[str] = ()) -> None:
        """Create missing topics: change topics with the configured partitions and cleanup
        policy; bookkeeping topics (heartbeats, stored cursors) compacted with one partition."""
        from confluent_kafka.cimpl import NewTopic

        admin = self.admin()
        existing = self._topic_names(admin)
        k = self.kafka
        wanted = [
            NewTopic(t, num_partitions=k.partitions, replication_factor=k.replication_factor,
                     config={"cleanup.policy": k.cleanup_policy})
            for t in sorted(set(data_topics)) if t not in existing
        ] + [
            NewTopic(t, num_partitions=1, replication_factor=k.replication_factor, config={"cleanup.policy": "compact"})
            for t in sorted(set(single_partition_compacted)) if t not in existing
        ]  # fmt: skip
        for topic, future in admin.create_topics(wanted, request_timeout=30).items() if wanted else []:
            _created(topic, future)

    def _topic_names(self, admin: AdminClient) -> set[str]:
        """The cluster's topics, asked in 1 s tries with the admin client's errors served
        between them: a broker that turns the client away is fatal within a second or two,
        not after the whole timeout."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                names = set(admin.list_topics(timeout=LIST_TRY_S).topics)
                self.refusal = None  # answered: whatever turned a client away was fixed (a user created, say)
                return names
            except KafkaException as exc:
                admin.poll(0)  # error_cb hears why (refused credentials, an unverified certificate)
                self.raise_if_refused()
                if time.monotonic() >= deadline:
                    raise self.unreachable(f"Kafka unreachable at {self.kafka.bootstrap_servers}: {exc}") from None


def _created(topic: str, future: Any) -> None:
    try:
        future.result(timeout=60)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        code = error.code() if isinstance(error, KafkaError) else None
        if code == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise FatalError(f"not authorized to create Kafka topic {topic}; create it or grant ACLs") from None
        raise RetriableError(f"creating Kafka topic {topic} failed: {exc}") from None


def _partitions(consumer: Consumer, topic: str) -> list[int] | None:
    found = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    if found is None or found.error is not None:
        return None
    return sorted(found.partitions)


def _code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


def _watermarks_of(
    admin: AdminClient, topics: list[str], isolation: IsolationLevel
) -> dict[str, dict[int, tuple[int, int]]]:
    found: dict[str, list[TopicPartition]] = {}
    for topic, future in admin.describe_topics(TopicCollection(topics), request_timeout=TIMEOUT_S).items():
        try:
            description = future.result()
        except KafkaException as exc:
            if _code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue  # a missing topic: an empty answer
            raise
        found[topic] = [TopicPartition(topic, p.id) for p in sorted(description.partitions, key=lambda p: p.id)]
    asked = [tp for partitions in found.values() for tp in partitions]
    lows, highs = {}, {}
    if asked:
        lows = admin.list_offsets(dict.fromkeys(asked, EARLIEST), isolation_level=isolation,
                                  request_timeout=TIMEOUT_S)  # fmt: skip
        highs = admin.list_offsets(dict.fromkeys(asked, LATEST), isolation_level=isolation,
                                   request_timeout=TIMEOUT_S)  # fmt: skip
    return {
        topic: {tp.partition: (lows[tp].result().offset, highs[tp].result().offset) for tp in found.get(topic, [])}
        for topic in topics
    }


def _read_to(consumer: Consumer, topic: str, high: int, wait_s: float) -> dict[bytes, bytes | None]:
    values: dict[bytes, bytes | None] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        values[msg.key() or b""] = msg.value()
        if (msg.offset() or 0) >= high - 1:
            return values
    raise RetriableError(f"reading {topic} to its end timed out after {wait_s:.0f} s")


def worker_options(kafka: KafkaConfig) -> dict[str, str]:
    """What a Spark task needs to build its consumer: client settings (TLS/SASL included)
    without the secrets, which the task reads from its environment by name, so they never
    travel in Spark's plan."""
    secret_keys = set(kafka.secret_options_env)
    client = {k: v for k, v in kafka.client_config(resolve_secrets=False).items() if k not in secret_keys}
    return {"client_config": json.dumps(client), "secret_options_env": json.dumps(kafka.secret_options_env)}


def worker_consumer(options: Mapping[str, str]) -> Consumer:
    """A Spark task's consumer, from ``worker_options`` (secrets read here, in the worker)."""
    settings: dict[str, Any] = json.loads(options["client_config"])
    for key, env_var in json.loads(options.get("secret_options_env", "{}")).items():
        settings[key] = os.environ[env_var]
    # partition EOF: a range that ends in transaction markers or aborted records (a
    # transactional producer's) has no record at its last offset; the end of the partition
    # (its last stable offset, read committed) says the range is read
    settings.update(
        {
            "group.id": CHANGELOG_GROUP_ID,
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
        }
    )
    return Consumer(settings)
