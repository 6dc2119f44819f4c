"""The Dagster code location: built from the config, one asset group per table, real
observations of the source tables, and no secret anywhere Dagster stores things."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from cdc_platform.config import load_config
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.devtools.stack.postgres import LocalPostgres
from cdc_platform.orchestration.definitions import build_definitions
from cdc_platform_tests.conftest import REPO_ROOT, write_config

# the shop source's fixed slot (cdc_shop) and the demo tables: these files take turns on one
# worker (scripts/test.sh), and no other test touches them
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("demo_tables")]


def _groups(defs: dg.Definitions) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for spec in defs.resolve_all_asset_specs():
        groups.setdefault(spec.group_name or "", set()).add(spec.key.to_user_string())
    return groups


def test_one_asset_group_per_configured_table() -> None:
    config = load_config(REPO_ROOT / "cdc_platform.yaml")
    groups = _groups(build_definitions(REPO_ROOT / "cdc_platform.yaml"))
    expected = {f"{t.source}_{t.dagster_name}" for t in config.tables}
    assert set(groups) == expected
    assert groups["shop_order_lines"] == {
        "shop/order_lines/source",
        "shop/order_lines/snapshot",
        "shop/order_lines/changelog",
        "shop/order_lines",  # current state
    }
    # history: true adds the SCD2 table, written by the same step as current
    assert groups["shop_customers"] == {
        "shop/customers/source",
        "shop/customers/snapshot",
        "shop/customers/changelog",
        "shop/customers",
        "shop/customers/history",
    }
    specs = {
        s.key.to_user_string(): s for s in build_definitions(REPO_ROOT / "cdc_platform.yaml").resolve_all_asset_specs()
    }
    assert specs["shop/orders/source"].kinds == {"postgres"}
    assert specs["shop/orders/source"].metadata["topic"] == "shop.public.orders"
    snapshot = specs["shop/orders/snapshot"]
    assert snapshot.kinds == {"spark", "delta", "postgres"}
    assert [d.asset_key.to_user_string() for d in snapshot.deps] == ["shop/orders/source"]
    assert isinstance(snapshot.partitions_def, dg.DynamicPartitionsDefinition)
    changelog = specs["shop/orders/changelog"]
    assert changelog.kinds == {"spark", "delta", "kafka"}
    # the demo's sources are streamed: a changelog partition per UTC day the apply wrote
    assert isinstance(changelog.partitions_def, dg.DynamicPartitionsDefinition)
    assert specs["shop/orders"].freshness_policy is not None
    current = specs["shop/orders"]
    assert {d.asset_key.to_user_string() for d in current.deps} == {"shop/orders/snapshot", "shop/orders/changelog"}


def test_dagster_definitions_validate_passes(tmp_path: Path) -> None:
    # the workspace's code location is what is validated; the demo's instance (dagster.yaml)
    # needs the dev stack, and dagster/test_instance.py tests it on the test stack's
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Validation successful" in result.stdout + result.stderr


def test_bad_config_fails_the_code_location_with_the_config_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: {}\nkafka: {bootstrap_servers: x}\nlake: {root: l}\ntables: []\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-m", "cdc_platform.definitions"],
        env={**os.environ, "CDC_PLATFORM_CONFIG": str(bad), "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "bad.yaml:1: sources: Dictionary should have at least 1 item" in result.stdout + result.stderr


def _observe(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("observe_sources")
    return job.execute_in_process(instance=instance, raise_on_error=False)


def test_observation_reports_the_source_table(demo_config_path: Path, tmp_path: Path, capture_password: str) -> None:
    defs = build_definitions(demo_config_path)
    (tmp_path / "dagster").mkdir()
    pg = LocalPostgres(_profile(demo_config_path))
    # capture's slot for source 'shop', idle. test_ui's capture leaves it behind (its position
    # is in the stack's heartbeats, so dropping it would fail the next capture with a lost
    # slot): created here only when missing, and dropped only then
    with pg.admin_connect("shop") as admin:
        created = admin.execute(
            "SELECT pg_create_logical_replication_slot('cdc_shop', 'pgoutput') "
            "WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = 'cdc_shop')"
        ).fetchone()
    try:
        with app_connect(_profile(demo_config_path)) as conn:
            conn.execute("UPDATE products SET name = name WHERE id <= 10")  # WAL behind the slot
        with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
            result = _observe(defs, instance)
    finally:
        if created is not None:
            with pg.admin_connect("shop") as admin:
                admin.execute("SELECT pg_drop_replication_slot('cdc_shop')")
    assert result.success
    observed = [ev.asset_observation_data.asset_observation for ev in result.get_asset_observation_events()]
    observations = {o.asset_key.to_user_string(): o for o in observed}
    with app_connect(_profile(demo_config_path)) as conn:
        row = conn.execute("SELECT count(*) FROM order_lines").fetchone()
    assert row is not None
    lines = observations["shop/order_lines/source"]
    assert lines.metadata["rows"].value == row[0]
    assert lines.metadata["key_columns"].value == "order_id, line_no"
    columns = {c.name: c for c in lines.metadata["dagster/column_schema"].value.columns}
    assert columns["unit_price"].type == "numeric(12,2)"
    assert columns["order_id"].constraints.nullable is False
    assert lines.metadata["capture_wal_status"].value == "reserved"
    assert lines.metadata["capture_lag_bytes"].value > 0  # the update above is behind the idle slot
    assert observations["bench/pgbench_accounts/source"].metadata["capture_slot"].value.startswith("missing")
    audit = observations["shop/audit_events/source"]
    assert audit.metadata["key_columns"].value == "event_id"  # configured: the table has no primary key
    assert audit.metadata["replica_identity"].value == "full"

    # the password reaches the connection, never Dagster's storage (runs, events, logs)
    stored = b"".join(p.read_bytes() for p in (tmp_path / "dagster").rglob("*") if p.is_file())
    assert stored, "the instance wrote nothing; the check below would be vacuous"
    assert capture_password.encode() not in stored


def _profile(config_path: Path) -> StackProfile:
    from cdc_platform.devtools.stack import PROFILES

    port = load_config(config_path).sources["shop"].port
    return next(p for p in PROFILES.values() if p.pg_port == port)


@pytest.mark.parametrize(
    ("table_sql", "table_yaml", "message"),
    [
        (
            "CREATE TABLE IF NOT EXISTS no_key_t (a int, b text)",
            "  - name: shop.public.no_key_t",
            "public.no_key_t has no primary key; add one, or name key columns in "
            'tables[shop.public.no_key_t].primary_key (and ALTER TABLE "public"."no_key_t" REPLICA IDENTITY FULL)',
        ),
        (
            "CREATE TABLE IF NOT EXISTS no_key_default_identity (a int, b text)",
            "  - name: shop.public.no_key_default_identity\n    primary_key: [a]",
            "public.no_key_default_identity has no primary key, so a configured key needs whole old rows: "
            'run ALTER TABLE "public"."no_key_default_identity" REPLICA IDENTITY FULL',
        ),
        (
            None,
            "  - name: shop.public.does_not_exist",
            'table public.does_not_exist does not exist in database "shop"',
        ),
    ],
)
def test_observation_fails_with_a_message_naming_the_fix(
    demo_db: StackProfile, tmp_path: Path, table_sql: str | None, table_yaml: str, message: str
) -> None:
    if table_sql:
        with app_connect(demo_db) as conn:
            conn.execute(table_sql)
    config_path = write_config(tmp_path / "c.yaml", demo_db, table_yaml)
    with dg.instance_for_test() as instance:
        result = _observe(build_definitions(config_path), instance)
    assert not result.success
    [failure] = [ev for ev in result.all_events if ev.is_step_failure]
    assert failure.step_failure_data.user_failure_data is not None  # a dg.Failure, not a crash
    assert message in (failure.step_failure_data.user_failure_data.description or "")


def test_bad_credentials_fail_with_the_fix_and_without_the_password(
    demo_config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_PG_PASSWORD", "wrong-password-xyz")
    with dg.instance_for_test() as instance:
        result = _observe(build_definitions(demo_config_path), instance)
    failures = [ev.step_failure_data for ev in result.all_events if ev.is_step_failure]
    assert failures
    for failure in failures:
        assert failure.user_failure_data is not None
        description = failure.user_failure_data.description or ""
        assert "bad credentials" in description and "password_env" in description
        assert "wrong-password-xyz" not in description


def test_snapshot_generation_materializes_with_watermark_and_reason(
    demo_config_path: Path, tmp_path: Path, capture_password: str
) -> None:
    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.orchestration.runs import start_generations

    with app_connect(_profile(demo_config_path)) as conn:
        row = conn.execute("SELECT count(*) FROM order_lines").fetchone()
    assert row is not None and row[0] >= 40
    # chunks of a twelfth of the table, 4 a wave: three waves at least
    entry = "  - name: shop.public.order_lines\n"
    text = demo_config_path.read_text()
    chunking = f"snapshot: {{chunk_rows: {row[0] // 12}, chunks_per_wave: 4}}"
    demo_config_path.write_text(text.replace(entry, f"{entry}    {chunking}\n"))
    config = load_config(demo_config_path)
    table = config.table("shop.public.order_lines")
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        [run] = start_generations(demo_config_path, [table], reason="manual", instance=instance)
        assert run.success
        # a second call with if_missing does nothing: the table has a committed generation
        assert (
            start_generations(demo_config_path, [table], reason="bootstrap", if_missing=True, instance=instance) == []
        )
        committed = Ledger(config.lake.root).committed(table.key)
        assert committed is not None and committed.generation == run.generation and committed.reason == "manual"
        record = instance.get_latest_materialization_event(dg.AssetKey(["shop", "order_lines", "snapshot"]))
        assert record is not None and record.asset_materialization is not None
        metadata = record.asset_materialization.metadata
        dagster_run = instance.get_run_by_id(run.run_id)
        assert dagster_run is not None and dagster_run.tags["cdc/reason"] == "manual"
        assert record.asset_materialization.partition == run.generation
        # the UI follows the generation wave by wave: numbers it can plot, rising to 100 %
        snapshot_key = dg.AssetKey(["shop", "order_lines", "snapshot"])
        observed = instance.fetch_observations(snapshot_key, limit=50, ascending=True)
        waves = [r.asset_observation.metadata for r in observed.records if r.asset_observation is not None]
        assert len(waves) >= 2 and [r.partition_key for r in observed.records] == [run.generation] * len(waves)
        done = [w["snapshot_chunks_done"].value for w in waves]
        assert done == sorted(done) and done[-1] == waves[-1]["snapshot_chunks"].value >= 12
        assert waves[-1]["snapshot_percent"].value == 100.0 and waves[0]["snapshot_percent"].value < 100.0
        assert all(isinstance(w["rows_per_s"].value, float) and "eta_s" in w for w in waves)
    with app_connect(_profile(demo_config_path)) as conn:
        row = conn.execute("SELECT count(*) FROM order_lines").fetchone()
    assert row is not None
    assert metadata["rows"].value == metadata["source_rows"].value == run.rows
    assert metadata["rows"].value == row[0]  # nothing writes to order_lines during this test
    assert str(metadata["watermark_lsn"].value).count("/") == 1
    assert int(str(metadata["bytes"].value)) > 0
    columns = {c.name: c.type for c in metadata["dagster/column_schema"].value.columns}  # type: ignore[union-attr]
    assert columns["unit_price"] == "decimal(12,2)" and columns["order_id"] == "bigint"
    stored = b"".join(p.read_bytes() for p in (tmp_path / "dagster").rglob("*") if p.is_file())
    assert capture_password.encode() not in stored


def test_the_cli_uses_the_config_it_was_given_from_any_directory(
    demo_db: StackProfile, tmp_path: Path, spark: object, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Bug 7: from a directory without ./cdc_platform.yaml, ``--config`` is the config of
    every command, the Dagster runs included. The CLI's own entry point, in this process (its
    runs are in-process Dagster runs on this worker's Spark session, as in a `cdc-platform`
    process; a cold driver of its own cost the suite about 3 minutes of a worker)."""
    from cdc_platform.cli.main import main

    config = write_config(tmp_path / "conf.yaml", demo_db, "  - name: shop.public.products\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CDC_PLATFORM_CONFIG", raising=False)
    code = main(["rehydrate", "--all", "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-3000:]
    assert "shop.public.products: current rebuilt" in out
    assert (tmp_path / "lake" / "shop" / "products" / "current" / "_delta_log").is_dir()  # the config's lake
