"""The demo's Dagster instance (the repo's dagster.yaml): runs, the event log and schedules
in the stack's PostgreSQL (the ``dagster`` role and database `cdc-platform dev up`
provisions), as a production instance keeps them. Tried here on the test stack: the same
file, only the port and the directories of its files moved."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from cdc_platform.devtools.stack import StackProfile
from cdc_platform.devtools.stack.postgres import DAGSTER_ROLE, PASSWORD_ENVS
from cdc_platform_tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


def _demo_instance_on(stack: StackProfile, home: Path) -> dg.DagsterInstance:
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    config["storage"]["postgres"]["postgres_db"]["port"] = stack.pg_port
    for files in ("local_artifact_storage", "compute_logs"):
        config[files]["config"]["base_dir"] = str(home / files)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def test_the_demo_instance_keeps_runs_and_events_in_the_stacks_postgres(stack: StackProfile, tmp_path: Path) -> None:
    instance = _demo_instance_on(stack, tmp_path)
    name = f"probe_{uuid.uuid4().hex[:8]}"

    @dg.asset(name=name)
    def probe() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"rows": 3})

    # a run stores events as a Dagster run does (the event log's NOTIFY included)
    result = dg.materialize([probe], instance=instance)
    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey(name))
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.metadata["rows"].value == 3
    assert instance.get_run_by_id(result.run_id) is not None
    # in PostgreSQL, as the dagster role, not in a SQLite file of the instance's directory
    password = os.environ[PASSWORD_ENVS[DAGSTER_ROLE]]
    with psycopg.connect(
        host="127.0.0.1", port=stack.pg_port, user=DAGSTER_ROLE, password=password, dbname=DAGSTER_ROLE
    ) as conn:
        stored = conn.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (result.run_id,)).fetchone()
    assert stored is not None and stored[0] > 0
    assert not list(tmp_path.rglob("*.db"))
    instance.dispose()
