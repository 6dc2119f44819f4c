"""No value stops a source (real PostgreSQL, Kafka, Spark): a timestamp capture cannot
convert (past 294247, beyond 64-bit microseconds), and a 2-D value in an int[] column,
in one table. Capture keeps streaming every table, restarts without looping on the
value, and that table's changelog dead-letters both (errors.tolerance: all) or stops
with the reason (none), never a failed task."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.model.errors import DeadLetterError
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = [pytest.mark.integration, pytest.mark.spark_codegen]

DDL = [
    "CREATE TABLE edges (id int PRIMARY KEY, ts timestamp, xs int[])",
    "CREATE TABLE items (id int PRIMARY KEY, body text)",
]

TOO_LATE = "294276-12-31 23:59:59"  # PostgreSQL's last timestamp; MicroTimestamp ends at 294247


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["edges", "items"]):
        env.configure_table("edges", "changelog: {grace_s: 0}")
        yield env


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _generation(env: CaptureEnv, spark: Any) -> tuple[Lake, str, datetime]:
    """The lake, the edges table's key, and a time before anything inserted after its generation."""
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.edges"
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    return lake, key, _now() - timedelta(seconds=1)


def test_an_unconvertible_value_stops_neither_the_source_nor_a_spark_task(env: CaptureEnv, spark: Any) -> None:
    env.configure_table("edges", "errors: {tolerance: all}")
    lake, key, t0 = _generation(env, spark)
    with env.app() as app:
        app.execute("INSERT INTO edges VALUES (1, '2026-11-24 10:00', '{1,2}')")
        # PostgreSQL accepts both: a timestamp no 64-bit microsecond count holds (issue 15's
        # crash was a BC timestamp, now exact), declared dimensions unenforced
        app.execute(f"INSERT INTO edges VALUES (2, '{TOO_LATE}', '{{3}}')")
        app.execute("INSERT INTO edges VALUES (3, '2026-11-24 11:00', '{{1,2},{3,4}}')")
        app.execute("INSERT INTO items VALUES (1, 'after the bad values')")
        app.execute("UPDATE edges SET xs = '{5}' WHERE id = 1")
    first = env.run_until_caught_up()  # raised ConversionError and stopped every table before
    again = env.capture(until_caught_up=True, give_up_after_s=60).run()  # a restart does not loop either
    assert first.events["unconvertible"] == 1 and again.events.get("unconvertible", 0) == 0
    items = [m.envelope["after"]["body"] for m in env.consume(["items"]) if m.value]
    assert items == ["after the bad values"]
    time.sleep(1.1)

    result = lake.window(key, t0, _now())
    assert result.dead_letters == 2 and result.events == {"c": 1, "u": 1}
    dead = sorted(r["error"] for r in spark.read.format("delta").load(lake.table(key).dead_letters_path).collect())
    assert "after.xs: cannot read" in dead[0] and "2 dimension(s), the column's lake type 1" in dead[0]
    assert dead[1].startswith(f"capture could not convert {env.schema}.edges.ts at LSN ")
    assert TOO_LATE in dead[1] and "64-bit microsecond" in dead[1] and "rehydrate" in dead[1]
    lake.current(key)
    rows = {r["id"]: r["xs"] for r in lake.read_current(key).collect()}
    assert rows == {1: [5]}  # the good changes applied around them


def test_under_tolerance_none_only_that_table_stops_with_the_reason(env: CaptureEnv, spark: Any) -> None:
    lake, key, t0 = _generation(env, spark)
    with env.app() as app:
        app.execute(f"INSERT INTO edges VALUES (2, '{TOO_LATE}', '{{3}}')")
    env.run_until_caught_up()
    time.sleep(1.1)
    with pytest.raises(DeadLetterError, match=r"capture could not convert .*edges\.ts") as info:
        lake.window(key, t0, _now())
    assert "errors.tolerance is 'none', so nothing was written" in str(info.value)
