"""What Dagster's run storage says about the platform's runs: which are still on their
way (so a sensor does not ask twice) and how often a piece of work was tried."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import dagster as dg

from cdc_platform.model.generations import RunState

IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
UNSUCCESSFUL = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
PARTITION_TAG = "dagster/partition"


@dataclass
class RunsInProgress:
    """The partitions being materialized by runs not finished yet, by job name and by
    asset key (a job's runs carry no asset selection; a launchpad run's do)."""

    by_job: dict[str, set[str]] = field(default_factory=dict)
    by_asset: dict[dg.AssetKey, set[str]] = field(default_factory=dict)

    def busy(self, key: dg.AssetKey, job_name: str) -> set[str]:
        return self.by_asset.get(key, set()) | self.by_job.get(job_name, set())


def runs_in_progress(instance: dg.DagsterInstance) -> RunsInProgress:
    """One query per tick: queued and running runs, by what they materialize."""
    out = RunsInProgress()
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS)):
        partition = run.tags.get(PARTITION_TAG, "")
        out.by_job.setdefault(run.job_name, set()).add(partition)
        for key in run.asset_selection or ():
            out.by_asset.setdefault(key, set()).add(partition)
    return out


def run_states(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, RunState]:
    states = {}
    for run_id in {r for r in run_ids if r}:
        run = instance.get_run_by_id(run_id)
        if run is not None:
            states[run_id] = RunState(alive=not run.is_finished, finished_unsuccessfully=run.status in UNSUCCESSFUL)
    return states


def attempts(instance: dg.DagsterInstance, tags: Mapping[str, str]) -> int:
    """How many runs carried these tags (a new attempt needs a new run key)."""
    return len(instance.get_run_ids(filters=dg.RunsFilter(tags=dict(tags))))
