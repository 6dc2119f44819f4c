"""Query-based capture (MariaDB, real server and Kafka): the three JDBC-source modes,
the compound cursor's guarantee, durable cursors, soft deletes and fatal errors."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.stack import StackProfile
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.errors import FatalError, RetriableError
from cdc_platform.sources.mysql.cursors import read_stored_cursors
from cdc_platform.sources.mysql.poller import PollingCapture
from cdc_platform_tests.integration.capture_env import Message
from cdc_platform_tests.integration.polling_env import PollingEnv, make_polling_env

ITEMS_DDL = """CREATE TABLE items (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(40) NOT NULL,
  qty INT NOT NULL DEFAULT 0,
  deleted_at DATETIME(6) NULL,
  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
)"""


@pytest.fixture
def env(stack: StackProfile, tmp_path: Path) -> Iterator[PollingEnv]:
    yield from make_polling_env(stack, tmp_path, [ITEMS_DDL])


def _items(env: PollingEnv, poll: str, batch_size: int = 1000) -> None:
    env.write_config(f"  - name: crm.{env.database}.items\n    poll: {poll}\n", f"    batch_size: {batch_size}")


def _events(env: PollingEnv) -> list[Message]:
    """Change events (tombstones left out) in source order: their positions."""
    return sorted((m for m in env.consume(["items"]) if m.value is not None), key=lambda m: m.lsn)


def _row(m: Message) -> dict[str, Any]:
    image = m.envelope["after"] or m.envelope["before"]
    assert isinstance(image, dict)
    return image


def test_incrementing_mode_publishes_new_rows_in_id_order(env: PollingEnv) -> None:
    _items(env, "{mode: incrementing, incrementing_column: id}", batch_size=7)
    with env.db() as db:
        db.executemany("INSERT INTO items (name, qty) VALUES (%s, %s)", [(f"i{i}", i) for i in range(30)])
    env.poll()
    with env.db() as db:
        db.execute("UPDATE items SET qty = 999 WHERE id = 1")  # incrementing mode does not see updates
        db.executemany("INSERT INTO items (name, qty) VALUES (%s, %s)", [(f"j{i}", i) for i in range(5)])
    env.poll()
    events = _events(env)
    assert [_row(m)["id"] for m in events] == list(range(1, 36))  # each row once, in id order
    assert {m.envelope["op"] for m in events} == {"c"}
    assert all(_row(m)["qty"] != 999 for m in events)
    first = events[0]
    assert json.loads(first.key or b"{}") == {"id": 1}  # the key holds exactly the key columns
    source = first.envelope["source"]
    assert source["connector"] == "jdbc" and source["mode"] == "incrementing"
    assert source["cursor"] == {"incrementing": 1}
    assert source["db"] == env.database and source["table"] == "items"
    stored = read_stored_cursors(KafkaClients(env.config.kafka), env.offsets_topic, env.source)[
        f"crm.{env.database}.items"
    ]
    assert (stored.incrementing, stored.rows) == (35, 35)


def test_timestamp_mode_publishes_inserts_and_updates_in_timestamp_order(env: PollingEnv) -> None:
    _items(env, "{mode: timestamp, timestamp_column: updated_at}", batch_size=4)
    with env.db() as db:
        # ten rows share one timestamp: a batch of 4 must not end inside them
        db.executemany(
            "INSERT INTO items (name, qty, updated_at) VALUES (%s, %s, '2026-01-01 00:00:00')",
            [(f"same{i}", i) for i in range(10)],
        )
        db.executemany(
            "INSERT INTO items (name, qty, updated_at) VALUES (%s, %s, %s)",
            [(f"t{i}", i, f"2026-01-01 00:00:0{i + 1}") for i in range(5)],
        )
    env.poll()
    with env.db() as db:
        db.execute("UPDATE items SET qty = 100, updated_at = '2026-01-02 00:00:00' WHERE name = 'same3'")
        db.execute("UPDATE items SET qty = 101, updated_at = '2026-01-02 00:00:01' WHERE name = 't0'")
        db.execute("UPDATE items SET qty = 102, updated_at = '2026-01-02 00:00:02' WHERE name = 'same3'")
    env.poll()
    events = _events(env)
    # a poll sees each row as it is then: same3's first update is superseded before the poll
    assert len(events) == 17
    assert Counter(_row(m)["name"] for m in events[:15]) == Counter(
        [f"same{i}" for i in range(10)] + [f"t{i}" for i in range(5)]
    )
    assert [(_row(m)["name"], _row(m)["qty"], m.envelope["op"]) for m in events[15:]] == [
        ("t0", 101, "u"), ("same3", 102, "u"),
    ]  # fmt: skip
    stamps = [m.envelope["source"]["cursor"]["timestamp"] for m in events]
    assert stamps == sorted(stamps)  # positions follow the cursor


def test_timestamp_incrementing_never_skips_rows_sharing_a_timestamp(env: PollingEnv) -> None:
    _items(env, "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id}", 40)
    with env.db() as db:
        db.executemany(
            "INSERT INTO items (name, qty, updated_at) VALUES (%s, %s, '2026-03-01 12:00:00')",
            [(f"n{i}", i) for i in range(500)],
        )
    poller = env.poll()
    assert poller.stats.rows[f"crm.{env.database}.items"] == 500
    with env.db() as db:
        # more rows at the same timestamp after the cursor reached it: still after (ts, id)
        db.executemany(
            "INSERT INTO items (name, qty, updated_at) VALUES (%s, %s, '2026-03-01 12:00:00')",
            [(f"late{i}", i) for i in range(3)],
        )
        db.execute("UPDATE items SET qty = -1, updated_at = '2026-03-01 12:00:01' WHERE id IN (7, 300)")
    env.poll()
    events = _events(env)
    assert sorted(_row(m)["id"] for m in events if m.envelope["op"] == "c") == list(range(1, 504))
    updates = [(_row(m)["id"], _row(m)["qty"]) for m in events if m.envelope["op"] == "u"]
    assert updates == [(7, -1), (300, -1)]
    cursors = [
        (m.envelope["source"]["cursor"]["timestamp"], m.envelope["source"]["cursor"]["incrementing"]) for m in events
    ]
    assert cursors == sorted(cursors)


def test_restart_resumes_from_the_stored_cursor_and_loses_nothing(
    env: PollingEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    _items(env, "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id}", 10)
    key = f"crm.{env.database}.items"
    with env.db() as db:
        db.executemany("INSERT INTO items (name) VALUES (%s)", [(f"a{i}",) for i in range(25)])
    env.poll()
    assert read_stored_cursors(KafkaClients(env.config.kafka), env.offsets_topic, env.source)[key].rows == 25
    with env.db() as db:
        db.executemany("INSERT INTO items (name) VALUES (%s)", [(f"b{i}",) for i in range(25)])
    # crash after Kafka acknowledged a batch's events but before its cursor was stored
    original = PollingCapture._commit_cursor
    commits = Counter[str]()

    def crash_on_second(self: PollingCapture, producer: Any, table: Any, cursor: Any) -> None:
        if self.tables:  # before, the preflight clears the stopped mark: not a batch's cursor
            commits["n"] += 1
        if commits["n"] == 2:
            raise RuntimeError("killed between the batch's ack and its cursor")
        original(self, producer, table, cursor)

    monkeypatch.setattr(PollingCapture, "_commit_cursor", crash_on_second)
    with pytest.raises(RuntimeError):
        env.poll()
    stored = read_stored_cursors(KafkaClients(env.config.kafka), env.offsets_topic, env.source)[key]
    assert stored.rows == 35  # the first new batch is stored, the second is not
    monkeypatch.setattr(PollingCapture, "_commit_cursor", original)
    restarted = env.poll()
    assert restarted.stats.rows[key] == 15  # resumed after the stored cursor: 10 re-sent + 5 new
    ids = Counter(_row(m)["id"] for m in _events(env))
    assert sorted(ids) == list(range(1, 51))  # nothing lost
    assert sum(ids.values()) == 60 and {ids[i] for i in range(36, 46)} == {2}  # only the unstored batch twice


def test_soft_delete_column_becomes_a_delete_event(env: PollingEnv) -> None:
    _items(
        env,
        "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id, "
        "soft_delete_column: deleted_at}",
    )
    with env.db() as db:
        db.executemany("INSERT INTO items (name) VALUES (%s)", [("keep",), ("drop",)])
    env.poll()
    with env.db() as db:
        db.execute("UPDATE items SET deleted_at = NOW(6) WHERE name = 'drop'")
    env.poll()
    records = env.consume(["items"])
    deletes = [m for m in records if m.value is not None and m.envelope["op"] == "d"]
    assert len(deletes) == 1
    assert deletes[0].envelope["before"]["name"] == "drop" and deletes[0].envelope["after"] is None
    tombstones = [m for m in records if m.value is None]
    assert [m.key for m in tombstones] == [deletes[0].key]


def test_bad_config_and_credentials_stop_at_once_with_the_fix(env: PollingEnv) -> None:
    _items(env, "{mode: timestamp+incrementing, timestamp_column: name, incrementing_column: id}")
    with pytest.raises(FatalError, match=r"not a datetime/timestamp column.*updated_at"):
        env.poll()
    _items(env, "{mode: incrementing, incrementing_column: nope}")
    with pytest.raises(FatalError, match="'nope' is not a column"):
        env.poll()
    _items(env, "{mode: incrementing, incrementing_column: id}")
    os.environ["WRONG_MARIADB_PASSWORD"] = "not-the-password"
    text = env.config_path.read_text().replace("CDC_MARIADB_PASSWORD", "WRONG_MARIADB_PASSWORD")
    env.config_path.write_text(text)
    with pytest.raises(FatalError, match="bad credentials for user cdc_poll") as raised:
        env.poll()
    assert "not-the-password" not in str(raised.value)


def test_unreachable_database_is_retried_then_reported(env: PollingEnv) -> None:
    _items(env, "{mode: incrementing, incrementing_column: id}")
    text = env.config_path.read_text().replace(f"port: {env.profile.mariadb_port}", "port: 1")
    env.config_path.write_text(text)
    poller = env.poller(give_up_after_s=1.0)
    with pytest.raises(RetriableError, match="gave up"):
        poller.run()
    assert poller.stats.reconnects >= 1


def test_initial_latest_starts_after_the_rows_already_there(env: PollingEnv) -> None:
    _items(
        env, "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id, initial: latest}"
    )
    with env.db() as db:
        db.executemany("INSERT INTO items (name) VALUES (%s)", [(f"old{i}",) for i in range(5)])
    assert env.poll().stats.rows[f"crm.{env.database}.items"] == 0  # the generation brings these
    with env.db() as db:
        db.executemany("INSERT INTO items (name) VALUES (%s)", [("new0",), ("new1",)])
    env.poll()
    assert [_row(m)["name"] for m in _events(env)] == ["new0", "new1"]
