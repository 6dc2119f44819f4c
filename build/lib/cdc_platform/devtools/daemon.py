"""What the Dagster daemon does, tick by tick, in one process: evaluate the platform's
sensors and its automation conditions against a real instance, and execute the runs they
request (the same jobs, tags and partitions). The fault suite and the recovery tests
drive the pipeline through this, so they exercise exactly the sensors and runs users run.

Run monitoring (the daemon's detection of runs whose process died) is ``reap_dead_runs``:
a run still marked started whose process is gone is marked failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from cdc_platform.devtools.stack.procs import is_alive
from cdc_platform.orchestration.definitions import build_definitions
from cdc_platform.orchestration.keys import current_keys
from cdc_platform.orchestration.resources import cached_config

SENSORS = ("rehydration", "changelog_windows")


@dataclass
class TickReport:
    requested: dict[str, int] = field(default_factory=dict)  # sensor (or 'automation') -> runs requested
    failed: list[str] = field(default_factory=list)  # run ids that failed

    @property
    def total(self) -> int:
        return sum(self.requested.values())


class Daemon:
    def __init__(
        self, config_path: str | Path, instance: dg.DagsterInstance, log: Callable[[str], None] = print
    ) -> None:
        self.config_path = str(Path(config_path).resolve())
        self.instance, self.log = instance, log
        self.defs = build_definitions(self.config_path)
        self.cursors: dict[str, str | None] = {}
        self.automation_cursor: Any = None

    # ------------------------------------------------------------ sensors

    def evaluate(self, name: str) -> dg.SensorResult:
        sensor = self.defs.resolve_sensor_def(name)
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursors.get(name), definitions=self.defs, resources=self.defs.resources
        )
        result = sensor(context)
        assert isinstance(result, dg.SensorResult), result
        self.cursors[name] = result.cursor
        return result

    def execute(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        """What the daemon does with a run request: add the partitions it needs, run the job."""
        assert request.job_name is not None
        job = self.defs.resolve_job_def(request.job_name)
        tags = {**request.tags, **({"dagster/run_key": request.run_key} if request.run_key else {})}
        return job.execute_in_process(
            instance=self.instance, partition_key=request.partition_key, tags=tags, raise_on_error=False
        )

    def add_partitions(self, result: dg.SensorResult) -> None:
        for addition in result.dynamic_partitions_requests or []:
            assert isinstance(addition, dg.AddDynamicPartitionsRequest)
            self.instance.add_dynamic_partitions(addition.partitions_def_name, list(addition.partition_keys))

    def tick(self, sensors: tuple[str, ...] = SENSORS, automation: bool = True) -> TickReport:
        """One round: each sensor, its runs executed; then current's automation."""
        report = TickReport()
        for name in sensors:
            result = self.evaluate(name)
            self.add_partitions(result)
            for request in result.run_requests or []:
                self._record(report, name, self.execute(request))
        if automation:
            for run in self.materialize_automation():
                self._record(report, "automation", run)
        return report

    def _record(self, report: TickReport, source: str, run: dg.ExecuteInProcessResult) -> None:
        report.requested[source] = report.requested.get(source, 0) + 1
        if not run.success:
            report.failed.append(run.run_id)
            self.log(f"{source}: run {run.run_id} failed")

    # ------------------------------------------------------------ automation (current)

    def materialize_automation(self) -> list[dg.ExecuteInProcessResult]:
        """Evaluate current's automation condition; materialize what it requests."""
        config = cached_config(self.config_path)
        keys = [k for t in config.tables for k in current_keys(t)]
        result = dg.evaluate_automation_conditions(
            defs=self.defs, instance=self.instance, asset_selection=dg.AssetSelection.assets(*keys),
            cursor=self.automation_cursor,
        )  # fmt: skip
        self.automation_cursor = result.cursor
        requested = [k for k in keys if result.get_num_requested(k)]
        runs = []
        for table in config.tables:
            selection = [k for k in current_keys(table) if k in requested]
            if selection:
                runs.append(self.materialize(current_keys(table), {"cdc/table": table.key, "cdc/kind": "current"}))
        return runs

    def materialize(self, selection: list[dg.AssetKey], tags: dict[str, str]) -> dg.ExecuteInProcessResult:
        assets = list(self.defs.assets or [])
        return dg.materialize(
            assets,  # type: ignore[arg-type]
            selection=selection,
            instance=self.instance,
            resources=dict(self.defs.resources or {}),
            tags={**tags, "dagster/from_automation_condition": "true"},
            raise_on_error=False,
        )

    # ------------------------------------------------------------ until quiet

    def settle(self, max_ticks: int = 30, quiet_ticks: int = 2) -> int:
        """Tick until ``quiet_ticks`` rounds in a row request nothing; returns the ticks run."""
        quiet = 0
        for tick in range(1, max_ticks + 1):
            report = self.tick()
            quiet = quiet + 1 if report.total == 0 else 0
            if quiet >= quiet_ticks:
                return tick
        raise TimeoutError(f"the pipeline did not settle within {max_ticks} ticks")

    # ------------------------------------------------------------ runs in other processes

    def launch(self, request: dg.RunRequest, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """The request's run in a process of its own (so a fault can kill it)."""
        assert request.job_name is not None
        script = (
            "import json, sys; import dagster as dg; "
            "from cdc_platform.orchestration.definitions import build_definitions; "
            "d = build_definitions(sys.argv[1]); job = d.resolve_job_def(sys.argv[2]); "
            "job.execute_in_process(instance=dg.DagsterInstance.get(), partition_key=sys.argv[3], "
            "tags=json.loads(sys.argv[4]))"
        )
        args = [sys.executable, "-c", script, self.config_path, request.job_name, request.partition_key or "",
                json.dumps(dict(request.tags))]  # fmt: skip
        return subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def reap_dead_runs(self) -> list[str]:
        """Run monitoring: runs still marked started whose process is gone are failed."""
        reaped = []
        statuses = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]
        for run in self.instance.get_runs(filters=dg.RunsFilter(statuses=statuses)):
            pid = run.tags.get("cdc/pid") or _run_pid(self.instance, run.run_id)
            if pid and not is_alive(int(pid)):
                self.instance.report_run_failed(run, "the run's process died (detected by run monitoring)")
                reaped.append(run.run_id)
        return reaped


def _run_pid(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The pid Dagster recorded when the run's process started (ENGINE_EVENT metadata)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_START).records
    for record in records:
        event = record.event_log_entry.dagster_event
        if event is not None and event.pid is not None:
            return str(event.pid)
    return None
