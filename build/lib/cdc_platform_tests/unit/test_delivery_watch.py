"""Capture ends a replication session whose Kafka producer stops delivering: after a broker
restart the fault suite saw a producer keep a partition's messages for two minutes (until
``message.timeout.ms``) while capture confirmed nothing; the next session's new producer
looks the partition leaders up afresh (sources/postgres/stream.py). The producer and the
replication cursor are stood in for; the broker restart itself is the fault suite's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cdc_platform.model.errors import RetriableError
from cdc_platform.sources.postgres.stream import DELIVERY_STALL_S, DeliveryWatch, _Session


def test_messages_waiting_without_any_delivery_report_are_a_stall() -> None:
    watch = DeliveryWatch(stall_s=30, now=0)
    assert not watch.stalled(waiting=3, now=29)
    assert watch.stalled(waiting=3, now=30)


def test_a_delivery_report_or_an_empty_producer_restarts_the_clock() -> None:
    watch = DeliveryWatch(stall_s=30, now=0)
    assert not watch.stalled(waiting=3, now=20)
    watch.delivered()  # a report, even a failed delivery: Kafka answers
    assert not watch.stalled(waiting=3, now=40)
    assert not watch.stalled(waiting=3, now=69)
    assert not watch.stalled(waiting=0, now=80)  # nothing waits: nothing can stall
    assert not watch.stalled(waiting=1, now=109)
    assert watch.stalled(waiting=1, now=110)


class _Producer:
    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def __len__(self) -> int:
        return self.waiting

    def poll(self, _timeout: float) -> int:
        return 0


def _session(producer: _Producer, heartbeats: list[Any]) -> _Session:
    capture = SimpleNamespace(
        stats=SimpleNamespace(confirmed_lsn=100, lag_seconds=lambda: 0.0),
        endpoint=SimpleNamespace(config=SimpleNamespace(heartbeat_interval_s=1.0)),
        settings=SimpleNamespace(status_interval_s=3600.0),
        _heartbeat=lambda _producer, _confirmed, _lag, on_delivery: heartbeats.append(on_delivery),
        report=lambda _confirmed: None,
    )
    cursor = SimpleNamespace(wal_end=0, send_feedback=lambda **_: None)
    return _Session(capture, cursor, producer, None)  # type: ignore[arg-type]


def test_a_session_whose_producer_stops_delivering_ends_to_reconnect() -> None:
    heartbeats: list[Any] = []
    session = _session(_Producer(waiting=2), heartbeats)
    start = session.watch._since
    session._idle(start + DELIVERY_STALL_S / 2)
    heartbeats[-1](None, None)  # the heartbeat's delivery report: Kafka still answers
    session._idle(start + DELIVERY_STALL_S)
    with pytest.raises(RetriableError, match=r"2 message\(s\) waited 30 s .* reconnecting with a new producer"):
        session._idle(start + 2 * DELIVERY_STALL_S)
