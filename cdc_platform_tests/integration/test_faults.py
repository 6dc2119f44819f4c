"""A trimmed fault-injection run (the full one: cdc-platform faults / make faults): under a
steady shop workload, each fault is injected for real, the pipeline recovers through the
platform's own sensors and runs (no side door), and current equals the source, dead
letters hold exactly the injected bad records, and the offsets accounting balances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.devtools.faults import FaultSuite, format_results

pytestmark = pytest.mark.integration


def test_recovers_from_each_fault(demo_db: Any, spark: Any, tmp_path: Path) -> None:
    # two tables and four faults keep it to a few minutes; the full run has six faults on four tables
    suite = FaultSuite(demo_db, tmp_path, rate=15, seed=3, pgbench=False, tables=("customers", "orders"))
    try:
        suite.setup()
        results = suite.run(["capture_kill", "bad_records", "spark_kill", "retention"], capture_kills=2)
    finally:
        suite.teardown()
    print(format_results(results))
    assert [r.fault for r in results if not r.recovered] == [], format_results(results)
    assert all(r.rows_compared > 100 and r.mismatches == 0 and r.accounting_ok for r in results)
    assert results[-1].expected_dead_letters == results[-1].dead_letters == 6  # 5 malformed + 1 oversized
    assert "changelog_gap -> generation" in next(r.note for r in results if r.fault == "retention")
    # the killed window's run failed and the sensor asked for the window again
    assert suite.instance is not None
    failed = suite.instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert any("died" in (e.message or "") for run in failed for e in suite.instance.all_logs(run.run_id))
    assert suite.workload.transactions > 100  # the workload really ran throughout
