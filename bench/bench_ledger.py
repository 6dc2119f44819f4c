"""A ledger record's cost, on the local disk and on an S3-compatible store.

Every stream batch of every table records its plan and its position in the pipeline-state
ledger (``lake/ledger.py``: small Delta tables written by delta-rs), and every pass reads it
back. This bench appends ``--records`` feed observations one by one, then reads the newest
back as many times, on a local directory and on the dev stack's S3 store (S3Proxy, started
for the run if it is not running). The floor, in the same run and on the same store: one
delta-rs append of the same row through a kept handle, the least a record can cost.

Run: make bench   (or .venv/bin/python bench/bench_ledger.py [--records 100])
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from cdc_platform.config.model import S3Config
from cdc_platform.devtools.stack.profiles import profile
from cdc_platform.devtools.stack.s3proxy import ACCESS_KEY_ID_ENV, SECRET_ACCESS_KEY_ENV, LocalS3Store
from cdc_platform.devtools.stack.stack import load_stack_env
from cdc_platform.lake.ledger import SCHEMAS, Ledger
from cdc_platform.lake.object_store import delta_rs_environment
from cdc_platform.model.feeds import FeedObservation

BUCKET = "ledger-bench"
WARM_UP = 5  # the first records create the table and load the client: not counted


def median_ms(action: Callable[[int], object], times: int) -> float:
    spent = []
    for i in range(times):
        started = time.perf_counter()
        action(i)
        spent.append(time.perf_counter() - started)
    return statistics.median(spent[WARM_UP:]) * 1000


def measure(root: str, records: int) -> tuple[float, float, float]:
    """(floor append, ledger append, ledger read) medians in ms under ``root``."""
    import deltalake
    import pyarrow as pa

    def observation(i: int) -> FeedObservation:
        return FeedObservation(datetime.now(UTC), i, {0: i}, True)

    floor_path = f"{root}/floor"
    row = {"table": "t", "at": datetime.now(UTC), "source_changes": 0, "topic_end": "{}"}
    deltalake.write_deltalake(floor_path, pa.Table.from_pylist([row], schema=SCHEMAS["feeds"]))
    handle = deltalake.DeltaTable(floor_path)
    floor = median_ms(
        lambda _i: deltalake.write_deltalake(
            handle, pa.Table.from_pylist([row], schema=SCHEMAS["feeds"]), mode="append"
        ),
        records,
    )  # fmt: skip
    ledger = Ledger(f"{root}/ledger")
    append = median_ms(lambda i: ledger.record_feed("t", observation(i)), records)
    read = median_ms(lambda _i: ledger.last_feed("t"), records)
    return floor, append, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args()
    prof = profile("dev")
    load_stack_env(prof)
    store = LocalS3Store(prof)
    started = store.up()
    try:
        (store.data / BUCKET).mkdir(parents=True, exist_ok=True)
        # delta-rs reads the store as a lake's config names it (``lake.s3``)
        s3 = S3Config(endpoint=store.endpoint, path_style=True, access_key_id_env=ACCESS_KEY_ID_ENV,
                      secret_access_key_env=SECRET_ACCESS_KEY_ENV)  # fmt: skip
        os.environ.update(delta_rs_environment(s3))
        print(f"{'store':<6} {'floor append':>13} {'ledger append':>14} {'ratio':>6} {'ledger read':>12}")
        with tempfile.TemporaryDirectory() as local:
            for name, root in (("local", local), ("s3", f"s3a://{BUCKET}/{uuid.uuid4().hex[:8]}")):
                floor, append, read = measure(root, args.records)
                print(f"{name:<6} {floor:10.1f} ms {append:11.1f} ms {append / floor:6.2f} {read:9.1f} ms")
    finally:
        if started:
            store.down()


if __name__ == "__main__":
    main()
