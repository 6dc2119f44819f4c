"""`cdc-platform verify` on the real stack, on a table whose identifiers need quoting
everywhere ("Order Items", mixed-case columns with spaces): capture, snapshot, changelog,
current and verify all work on it, and verify finds every kind of difference."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.cli import main
from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.verify import VerifyContext, verify_table
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration

DDL = [
    'CREATE TABLE "Order Items" ("Order Id" int, "Line" int, "Qty Ordered" numeric(10,2), "Note" text, '
    'PRIMARY KEY ("Order Id", "Line"))'
]


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["Order Items"]):
        text = env.config_path.read_text()
        env.config_path.write_text(
            text.replace(
                f"  - name: cap.{env.schema}.Order Items\n",
                f"  - name: 'cap.{env.schema}.\"Order Items\"'\n    changelog: {{grace_s: 0}}\n",
            )
        )
        yield env


def test_verify_on_quoted_identifiers(env: CaptureEnv, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = env.config
    lake = Lake(config, spark)
    key = f'cap.{env.schema}."Order Items"'
    table = config.table(key)
    assert table.table_name == "Order Items" and config.topic_for(table).endswith(".Order_Items")
    env.run_until_caught_up()
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO \"Order Items\" SELECT g / 3, g % 3, g * 1.5, 'n' || g FROM generate_series(1, 60) g")
    env.run_until_caught_up()
    lake.snapshot(key, "g1")
    with env.app() as app:
        app.execute('UPDATE "Order Items" SET "Note" = \'changed\' WHERE "Line" = 1')
        app.execute('DELETE FROM "Order Items" WHERE "Order Id" = 2')
        app.execute('UPDATE "Order Items" SET "Order Id" = 100 WHERE "Order Id" = 3')  # key change
    env.run_until_caught_up()
    time.sleep(1.1)
    lake.window(key, t0, datetime.now(UTC).replace(microsecond=0))
    lake.current(key)
    ctx = VerifyContext(spark, lake.ledger, lake.source(key), lake.kafka)

    with env.running_capture():  # verify waits for capture to confirm the position it read
        verdict = verify_table(ctx, lake.table(key), timeout_s=60)
        assert verdict.ok, (verdict.note, verdict.sample)
        assert verdict.source_rows == verdict.current_rows == 57

        # a lost row, a wrong value and a ghost row are each found and named
        path = lake.table(key).current_path
        current = spark.read.format("delta").load(path)
        from pyspark.sql import functions as F

        tampered = (
            current.where(~((F.col("Order Id") == 5) & (F.col("Line") == 0)))
            .withColumn("Note", F.when(F.col("Order Id") == 6, F.lit("wrong")).otherwise(F.col("Note")))
            .where(~((F.col("Order Id") == 6) & (F.col("Line") != 0)))
        )
        ghost = current.where((F.col("Order Id") == 7) & (F.col("Line") == 0)).withColumn("Order Id", F.lit(999))
        tampered.union(ghost).localCheckpoint().write.format("delta").mode("overwrite").save(path)
        verdict = verify_table(ctx, lake.table(key), timeout_s=60, rounds=1)
        assert (verdict.missing, verdict.mismatches, verdict.extra) == (3, 1, 1), verdict.sample
        assert 'missing {"Order Id": 5, "Line": 0}' in verdict.sample
        assert 'differs {"Order Id": 6, "Line": 0}' in verdict.sample

        assert (
            main(["verify", f'cap.{env.schema}."Order Items"', "--config", str(env.config_path), "--rounds", "1"]) == 1
        )
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "mismatches" in out and 'extra {"Order Id": 999, "Line": 0}' in out
