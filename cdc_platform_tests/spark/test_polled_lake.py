"""A polled (MariaDB) table through the same lake assets: Spark JDBC snapshot with the
type mapping, changelog + current from polled events, hard deletes reported by
completeness and dropped by a reconciliation generation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.capture.jdbc import PollOptions
from cdc_platform.devstack import StackProfile
from cdc_platform.spark.changelog import materialize_window
from cdc_platform.spark.checks import check_completeness
from cdc_platform.spark.current import apply_changes, current_path
from cdc_platform.spark.snapshot import take_snapshot
from cdc_platform.spark.verify import verify_table
from cdc_platform_tests.cases.mysql_types import MYSQL_TYPE_CASES, type_cases_ddl
from cdc_platform_tests.integration.polling_env import PollingEnv, make_polling_env

ACCOUNTS_DDL = """CREATE TABLE accounts (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(80) NOT NULL,
  balance DECIMAL(12,2) NOT NULL,
  active TINYINT(1) NOT NULL DEFAULT 1,
  deleted_at DATETIME(6) NULL,
  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
)"""
POLL = "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id"


@pytest.fixture
def env(stack: StackProfile, tmp_path: Path) -> Iterator[PollingEnv]:
    yield from make_polling_env(stack, tmp_path, [ACCOUNTS_DDL, type_cases_ddl()])


def _window(env: PollingEnv, spark: Any, table: Any, start: datetime) -> datetime:
    env.poll()
    time.sleep(1.1)
    end = datetime.now(UTC).replace(microsecond=0)
    materialize_window(spark, env.config, table, start, end)
    return end


def _lake(spark: Any, path: str) -> dict[int, dict[str, Any]]:
    frame = spark.read.format("delta").load(path).drop("_cdc_commit_lsn", "_cdc_lsn")
    return {r["id"]: r.asDict() for r in frame.collect()}


def _source(env: PollingEnv, where: str = "deleted_at IS NULL") -> dict[int, tuple[str, str, bool]]:
    with env.db() as db:
        db.execute(f"SELECT id, email, CAST(balance AS CHAR), active FROM accounts WHERE {where}")
        return {int(r[0]): (str(r[1]), str(r[2]), bool(r[3])) for r in db.fetchall()}


def _as_source(rows: dict[int, dict[str, Any]]) -> dict[int, tuple[str, str, bool]]:
    return {k: (r["email"], str(r["balance"]), r["active"]) for k, r in rows.items()}


def test_every_mariadb_type_lands_the_same_through_snapshot_and_polling(env: PollingEnv, spark: Any) -> None:
    env.write_config(f"  - name: crm.{env.database}.type_cases\n    poll: {POLL}}}\n    changelog: {{grace_s: 0}}\n")
    config = env.config
    table = config.table(f"crm.{env.database}.type_cases")
    take_snapshot(spark, config, table, "g1")  # empty: every row arrives through polling
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.db() as db:
        for name, _, literal, *_ in MYSQL_TYPE_CASES:
            db.execute(f"INSERT INTO type_cases (case_name, {name}) VALUES ('{name}', {literal})")
    _window(env, spark, table, start)
    applied = apply_changes(spark, config, table)
    assert applied.changes_applied == len(MYSQL_TYPE_CASES)
    expected = {name: value for name, _, _, value, _ in MYSQL_TYPE_CASES}
    current = spark.read.format("delta").load(current_path(config, table)).drop("_cdc_commit_lsn", "_cdc_lsn")
    assert {r["case_name"]: r[r["case_name"]] for r in current.collect()} == expected
    # and through a Spark JDBC snapshot: the same types, the same values, the same rows
    snapshot = spark.read.format("delta").load(take_snapshot(spark, config, table, "g2").path)
    lake_types = {f.name: f.dataType.simpleString() for f in snapshot.schema.fields}
    assert {name: lake_types[name] for name, *_ in MYSQL_TYPE_CASES} == {n: t for n, *_, t in MYSQL_TYPE_CASES}
    assert {r["case_name"]: r[r["case_name"]] for r in snapshot.collect()} == expected
    assert snapshot.schema == current.schema
    assert (snapshot.exceptAll(current).count(), current.exceptAll(snapshot).count()) == (0, 0)
    unsigned_max = snapshot.where("case_name = 'c_bigint_u'").first()
    assert unsigned_max is not None and unsigned_max["c_bigint_u"] == 18446744073709551615  # no overflow


def test_hard_deletes_are_reported_and_a_reconciliation_generation_drops_them(env: PollingEnv, spark: Any) -> None:
    env.write_config(
        f"  - name: crm.{env.database}.accounts\n    poll: {POLL}, soft_delete_column: deleted_at, "
        "reconcile_every: 6h}\n    changelog: {grace_s: 0}\n"
    )
    config = env.config
    table = config.table(f"crm.{env.database}.accounts")
    with env.db() as db:
        db.executemany(
            "INSERT INTO accounts (email, balance) VALUES (%s, %s)", [(f"a{i}@x.io", f"{i}.50") for i in range(40)]
        )
    env.poll()
    take_snapshot(spark, config, table, "g1")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.db() as db:
        db.execute("UPDATE accounts SET balance = balance + 100 WHERE id % 5 = 0")
        db.execute("UPDATE accounts SET active = 0 WHERE id IN (2, 3)")
        db.executemany(
            "INSERT INTO accounts (email, balance) VALUES (%s, %s)", [(f"n{i}@x.io", "1.00") for i in range(5)]
        )
        db.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id IN (6, 7, 8)")  # soft deletes: seen
        db.execute("DELETE FROM accounts WHERE id IN (11, 12, 13, 41)")  # hard deletes: invisible to polling
    start = _window(env, spark, table, start)
    first = apply_changes(spark, config, table)
    assert first.dropped_by_generation is None  # the first build has no earlier current to compare
    current = _lake(spark, current_path(config, table))
    live = _source(env)
    hard_deleted = {11, 12, 13}  # 41 came and went between two polls: never seen at all
    assert _as_source(current) == live | {k: _as_source(current)[k] for k in hard_deleted}
    assert not {6, 7, 8} & set(current)  # soft deletes became deletes
    assert hard_deleted <= set(current) and 41 not in current  # polling cannot see hard deletes: they linger
    frame = spark.read.format("delta").load(current_path(config, table)).drop("_cdc_commit_lsn", "_cdc_lsn")
    report = check_completeness(spark, config, table, frame, first.frontier, first.applied_commit_lsn)
    assert report.deleted_in_source == 3
    assert report.passed  # the changelog itself is complete; the lingering rows are a warning
    assert any('"id": 11' in s for s in report.sample)
    # the reconciliation generation: current rebuilds from it and equals the source
    take_snapshot(spark, config, table, "g2")
    rebuilt = apply_changes(spark, config, table)
    assert rebuilt.rebuilt and rebuilt.dropped_by_generation == 3
    assert _as_source(_lake(spark, current_path(config, table))) == _source(env)
    # changes after the new watermark still flow
    with env.db() as db:
        db.execute("UPDATE accounts SET balance = 7.77 WHERE id = 1")
        db.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id = 9")
    _window(env, spark, table, start)
    later = apply_changes(spark, config, table)
    assert later.changes_applied >= 2
    assert _as_source(_lake(spark, current_path(config, table))) == _source(env)
    frame = spark.read.format("delta").load(current_path(config, table)).drop("_cdc_commit_lsn", "_cdc_lsn")
    assert (
        check_completeness(spark, config, table, frame, later.frontier, later.applied_commit_lsn).deleted_in_source == 0
    )
    # verify waits for a poll that began after it, then compares row by row; a hard
    # delete shows as a row only current has
    with env.db() as db:
        db.execute("DELETE FROM accounts WHERE id = 14")
    poller = env.poller()
    poller.options = PollOptions(give_up_after_s=60)
    running = threading.Thread(target=poller.run, daemon=True)
    running.start()
    try:
        verdict = verify_table(spark, config, table, timeout_s=60, rounds=1)
    finally:
        poller.stop()
        running.join(30)
    assert (verdict.note, verdict.missing, verdict.mismatches, verdict.extra) == ("", 0, 0, 1)
    assert verdict.sample == ['extra {"id": 14}']
