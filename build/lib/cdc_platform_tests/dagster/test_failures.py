"""Failure handling on a real instance: a fatal error fails once (no retry) with the fix
in its message, the failed generation is recorded as failed in the ledger, and the
run-failure sensor names the table and reason (a transient outage: test_retries.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.config import load_config
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.generations import GenerationStatus
from cdc_platform.orchestration.runs import start_generations
from cdc_platform.orchestration.sensors.failures import describe_failure
from cdc_platform_tests.conftest import write_config

# the shop source's fixed slot (cdc_shop) and the demo tables: these files take turns on one
# worker (scripts/test.sh), and no other test touches them
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("demo_tables")]


def test_fatal_failure_is_not_retried_and_is_reported(demo_db: Any, spark: Any, tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", demo_db, "  - name: shop.public.no_such_table\n")
    config = load_config(path)
    with dg.instance_for_test() as instance:
        [run] = start_generations(path, config.tables, reason="manual", instance=instance)
        assert not run.success
        dagster_run = instance.get_run_by_id(run.run_id)
        assert dagster_run is not None
        steps = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        assert len(steps) == 1  # fatal: failed once, no retry
        assert not instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
        [failure] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert failure.dagster_event is not None
        context = dg.build_run_status_sensor_context(
            sensor_name="cdc_run_failures",
            dagster_instance=instance,
            dagster_run=dagster_run,
            dagster_event=failure.dagster_event,
        ).for_run_failure()
        report = describe_failure(context)
    assert report.startswith("run for shop.public.no_such_table (rehydration: manual) failed: table public.no_such")
    assert "does not exist" in report and "fix the name in the config or create the table" in report
    [generation] = Ledger(config.lake.root).generations("shop.public.no_such_table").values()
    assert generation.status is GenerationStatus.FAILED and generation.detail.startswith("fatal: table public.no_such")
