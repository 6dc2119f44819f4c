"""A polled MariaDB table through the Dagster assets on a real instance: observation with
the poll cursor, bootstrap generation, current with its checks; hard deletes make the
completeness check warn (not a rehydration), and the reconciliation reason's generation
drops them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.orchestration.keys import COMPLETENESS_CHECK, KEYS_CHECK, current_asset_key, source_asset_key
from cdc_platform_tests.dagster.test_rehydration import Harness
from cdc_platform_tests.integration.polling_env import PollingEnv, make_polling_env

DDL = """CREATE TABLE accounts (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(80) NOT NULL,
  plan ENUM('free', 'pro') NOT NULL DEFAULT 'free',
  deleted_at DATETIME(6) NULL,
  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
)"""


@pytest.fixture
def env(stack: Any, tmp_path: Path) -> Iterator[PollingEnv]:
    for env in make_polling_env(stack, tmp_path, [DDL]):
        env.write_config(
            f"  - name: crm.{env.database}.accounts\n    poll: {{mode: timestamp+incrementing, "
            "timestamp_column: updated_at, incrementing_column: id, soft_delete_column: deleted_at, "
            "reconcile_every: 30m}\n    changelog: {grace_s: 0}\n"
        )
        yield env


def _evaluation(instance: dg.DagsterInstance, table: Any, name: str) -> tuple[str, Any]:
    key = dg.AssetCheckKey(current_asset_key(table), name)
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert record.event is not None and record.event.dagster_event is not None
    return record.status.value, record.event.dagster_event.event_specific_data


def _check(instance: dg.DagsterInstance, table: Any, name: str) -> tuple[str, dict[str, Any], Any]:
    status, evaluation = _evaluation(instance, table, name)
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    return status, metadata, evaluation.severity


def _live(env: PollingEnv) -> dict[int, tuple[str, str]]:
    with env.db() as db:
        db.execute("SELECT id, email, plan FROM accounts WHERE deleted_at IS NULL")
        return {int(r[0]): (str(r[1]), str(r[2])) for r in db.fetchall()}


@pytest.mark.long_running
def test_polled_table_assets_checks_and_reconciliation(
    env: PollingEnv, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with env.db() as db:
        db.executemany("INSERT INTO accounts (email) VALUES (%s)", [(f"a{i}@x.io",) for i in range(20)])
    env.poll()
    with dg.instance_for_test() as instance:
        h = Harness(env, instance, f"crm.{env.database}.accounts")
        observed = h.defs.resolve_job_def("observe_sources").execute_in_process(instance=instance)
        assert observed.success
        [seen] = [e.asset_observation_data.asset_observation for e in observed.get_asset_observation_events()]
        assert seen.asset_key == source_asset_key(h.table)
        observation = {k: v.value for k, v in seen.metadata.items()}
        assert observation["rows"] == 20 and observation["poll_rows_published"] == 20
        assert observation["key_columns"] == "id"
        h.execute(h.expect("bootstrap"))
        # no poller running: no poll after the check's read can confirm it, so rows are not
        # compared, and a check that did not verify current warns (keys alone would pass)
        assert h.current()
        status, evaluation = _evaluation(instance, h.table, COMPLETENESS_CHECK)
        assert (status, evaluation.severity) == ("FAILED", dg.AssetCheckSeverity.WARN)
        assert "rows not compared: the poller stopped" in evaluation.description, evaluation.description
        assert "cdc-platform capture run --source crm" in evaluation.description
        with env.running_poller():
            assert h.current()
        status, metadata, _ = _check(instance, h.table, COMPLETENESS_CHECK)
        assert (status, metadata["deleted_in_source"], metadata["reconciled"]) == ("SUCCEEDED", 0, True)
        # a soft delete, an update and two hard deletes, through polling and one window
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        with env.db() as db:
            db.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id = 3")
            db.execute("UPDATE accounts SET plan = 'pro' WHERE id = 4")
            db.execute("DELETE FROM accounts WHERE id IN (5, 6)")
        env.poll()
        time.sleep(1.1)
        Lake(h.config, spark).window(h.table.key, start, datetime.now(UTC).replace(microsecond=0))
        with env.running_poller():
            assert h.current()
        status, metadata, severity = _check(instance, h.table, COMPLETENESS_CHECK)
        assert (status, metadata["deleted_in_source"], severity) == ("FAILED", 2, dg.AssetCheckSeverity.WARN)
        assert _check(instance, h.table, KEYS_CHECK)[0] == "SUCCEEDED"
        # a warning is not a rehydration cause; the reconciliation interval is
        assert not h.tick().run_requests
        later = datetime.now(UTC) + timedelta(hours=1)
        monkeypatch.setattr("cdc_platform.orchestration.sensors.rehydration.utc_now", lambda: later)
        h.execute(h.expect("reconciliation"))
        monkeypatch.undo()
        with env.running_poller():
            assert h.current()
        current = Lake(h.config, spark).read_current(h.table.key)
        assert {r["id"]: (r["email"], r["plan"]) for r in current.collect()} == _live(env)
        status, evaluation = _evaluation(instance, h.table, COMPLETENESS_CHECK)
        metadata = {k: v.value for k, v in evaluation.metadata.items()}
        assert (status, metadata["deleted_in_source"], metadata["rows_dropped_by_generation"]) == (
            "SUCCEEDED",
            0,
            2,
        ), (evaluation.description, metadata)
        assert not h.tick().run_requests  # reconciled: nothing more to do until the next interval
