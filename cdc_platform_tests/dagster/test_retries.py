"""A transient outage during a generation is retried by the run's RetryPolicy, not failed
as fatal (issue 13, bug 6). Not serial: its source is unreachable on purpose and shares
nothing with other tests, and most of its minute is the policy's backoff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.config import load_config
from cdc_platform.orchestration.runs import start_generations

pytestmark = pytest.mark.integration


def test_a_transient_outage_is_retried_not_fatal(demo_db: Any, spark: Any, tmp_path: Path) -> None:
    """Bug 6: a MariaDB that cannot be reached during a generation is a retriable failure."""
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""sources:
  crm: {{kind: jdbc, port: 1, database: crm, user: cdc_poll, password_env: CDC_MARIADB_PASSWORD,
         apply: {{engine: windows}}}}
kafka: {{bootstrap_servers: "{demo_db.kafka_bootstrap}"}}
lake: {{root: lake}}
tables:
  - name: crm.crm.accounts
    poll: {{mode: incrementing, incrementing_column: id}}
"""
    )
    config = load_config(path)
    with dg.instance_for_test() as instance:
        [run] = start_generations(path, config.tables, reason="manual", instance=instance)
        assert not run.success
        retries = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
        failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    assert len(retries) == 3 and len(failures) == 1  # the RetryPolicy's three retries, then it gave up
    [failure] = failures
    assert failure.dagster_event is not None
    data = failure.dagster_event.step_failure_data
    assert data.user_failure_data is not None
    assert data.user_failure_data.metadata["error_class"].value == "retriable"
    assert "is the database up" in (data.user_failure_data.description or "")
