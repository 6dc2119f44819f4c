"""What a user runs to bring tables into a lake, as the end-to-end tests of a deployment
shape (a Spark cluster, an object store, a Kafka cluster) start it: capture streaming, a
workload writing, a generation taken with ``cdc-platform snapshot --all``, then the
continuous ``cdc-platform apply`` on it; and verify on the lake they fed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from cdc_platform.devtools.apply_process import ApplyProcess
from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.verify import VerifyContext, verify_tables
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


def assert_verified(lake: Lake, keys: Sequence[str], apply: ApplyProcess) -> None:
    """Verify on ``keys`` while capture and the apply run, in this process' session (the
    store configured as the CLI configures its own): a CLI run would start a Spark
    application of its own (on a cluster, a minute of cold executors), and the CLI's verify
    is ``spark/test_verify.py``'s. Each table compared and equal to the source."""
    source = lake.source(keys[0])  # the deployment tests' tables share one source
    verdicts = verify_tables(
        lambda _t: VerifyContext(lake.spark, lake.ledger, source, lake.kafka), [lake.table(k) for k in keys],
        timeout_s=600, rounds=2,
    )  # fmt: skip
    assert [v.table for v in verdicts] == list(keys)
    assert all(v.ok and v.source_rows > 0 for v in verdicts), [(v.table, v.note, v.sample) for v in verdicts] + [
        apply.tail()
    ]
