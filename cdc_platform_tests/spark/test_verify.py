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

        # a change Kafka holds and current has not applied, with nothing applying it: verify
        # reads the source, waits for current until its timeout, and says what to run
        with env.app() as app:
            app.execute('UPDATE "Order Items" SET "Note" = \'later\' WHERE "Line" = 2')
        behind = verify_table(ctx, lake.table(key), timeout_s=12, rounds=1)
        assert not behind.ok and behind.source_rows == 0, behind
        assert "current has not applied what Kafka held when the source was read" in behind.note, behind.note
        assert f"cdc-platform apply --source {table.source}" in behind.note
    printed = capsys.readouterr()
    out = printed.out
    assert "DIFFERS" in out and "mismatches" in out and "seconds" in out and 'extra {"Order Id": 999, "Line": 0}' in out
    # progress as each table finishes, the table named as in the verdicts' table
    assert f"cap.{env.schema}.Order Items: DIFFERS after " in printed.err
    assert "1/1 tables done" in printed.err


@pytest.fixture
def keyless_env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    """A table without a primary key, keyed in the config: nothing in PostgreSQL keeps
    its key unique."""
    ddl = ["CREATE TABLE visits (page text, n int)", "ALTER TABLE visits REPLICA IDENTITY FULL"]
    for env in make_capture_env(demo_db, tmp_path, ddl, ["visits"]):
        env.configure_table("visits", "primary_key: [page]\n    changelog: {grace_s: 0}")
        yield env


def test_a_key_the_source_holds_twice_fails_verify_and_completeness(keyless_env: CaptureEnv, spark: Any) -> None:
    """Current keeps one row per key: a configured key the source holds twice, in two
    rows that are alike, leaves current a row short. Comparing by key, each source row
    found its twin in current, so verify and the completeness check passed while current
    lacked a row. The source's rows per key are counted now."""
    env = keyless_env
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.visits"
    env.run_until_caught_up()
    with env.app() as app:
        app.execute("INSERT INTO visits SELECT 'p' || g, g FROM generate_series(1, 20) g")
    lake.snapshot(key, "g1")
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.app() as app:
        app.execute("INSERT INTO visits VALUES ('p7', 7)")  # the same row again
    env.run_until_caught_up()
    time.sleep(1.1)
    lake.window(key, t0, datetime.now(UTC).replace(microsecond=0))
    lake.current(key)
    assert lake.read_current(key).count() == 20  # 21 rows in the source

    ctx = VerifyContext(spark, lake.ledger, lake.source(key), lake.kafka)
    with env.running_capture():
        verdict = verify_table(ctx, lake.table(key), timeout_s=60, rounds=1)
        assert not verdict.ok
        assert (verdict.source_rows, verdict.current_rows, verdict.missing) == (21, 20, 1), verdict.sample
        assert 'repeated in the source {"page": "p7"}' in verdict.sample
        report = lake.completeness(key)
    assert not report.passed
    assert (report.repeated, report.missing) == (1, 1), report.sample
