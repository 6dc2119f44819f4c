"""What a user runs to bring tables into a lake, as the end-to-end tests of a deployment
shape (a Spark cluster, an object store, a Kafka cluster) start it: capture streaming, a
workload writing, a generation taken with ``cdc-platform snapshot --all``, then the
continuous ``cdc-platform apply`` on it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from cdc_platform.devtools.apply_process import ApplyProcess
from cdc_platform_tests.integration.capture_env import CaptureEnv
from cdc_platform_tests.integration.test_capture_faults import Workload
from cdc_platform_tests.spark.test_apply import PAUSE_S


@contextmanager
def streaming_after_a_generation(
    env: CaptureEnv, cli: Sequence[str], run_env: Mapping[str, str], apply: ApplyProcess, seed: int
) -> Iterator[Workload]:
    """For the block: capture running, the workload writing (stop it in the block), the
    generation committed and the apply past its first batch. The apply is left running."""
    with env.running_capture():
        workload = Workload(env, seconds=None, seed=seed, pause_s=PAUSE_S)
        workload.start()
        try:
            workload.wait_for(40)
            snapshot = subprocess.run(
                [*cli, "snapshot", "--all"], env=dict(run_env), capture_output=True, text=True, timeout=600, check=False
            )
            assert snapshot.returncode == 0, snapshot.stdout[-2000:] + snapshot.stderr[-4000:]
            apply.start()  # continuous, as `make demo` runs it
            apply.wait_for_batch()
            yield workload
        finally:
            workload.stop()
