"""The CLI loads ``--config`` first and every command uses that file; the code location
is built lazily from an explicit path; an installed package finds its jars from a setting,
not from the dev stack (issue 13, bug 7). No services needed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.cli.main import main
from cdc_platform.config import ConfigError, load_config
from cdc_platform.lake.session import PINNED_PACKAGES, jar_settings, session_conf
from cdc_platform.orchestration.definitions import build_definitions
from cdc_platform_tests.conftest import REPO_ROOT

DEMO_CONFIG = REPO_ROOT / "cdc_platform.yaml"


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config outside the working directory, and a working directory without one."""
    config = tmp_path / "conf" / "platform.yaml"
    config.parent.mkdir()
    config.write_text(DEMO_CONFIG.read_text())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("CDC_PLATFORM_CONFIG", raising=False)
    return config


@pytest.mark.parametrize("before", [True, False])
def test_every_pipeline_command_runs_with_the_config_it_was_given(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], before: bool
) -> None:
    seen: list[Path] = []

    def apply_current(config_path: Path, tables: list[Any], instance: Any = None) -> list[tuple[str, bool, str]]:
        seen.append(Path(config_path))
        return [(t.key, True, "run") for t in tables]

    monkeypatch.setattr("cdc_platform.orchestration.runs.apply_current", apply_current)
    args = ["current", "--all"]
    args = ["--config", str(elsewhere), *args] if before else [*args, "--config", str(elsewhere)]
    assert main(args) == 0
    assert seen == [elsewhere.resolve()]
    assert "shop.public.customers: applied" in capsys.readouterr().out


def test_config_check_says_how_each_table_is_applied(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A streamed table's changelog is partitioned by day whatever its window setting: the
    check prints the engine and the partition, not a window no run uses."""
    text = elsewhere.read_text()
    head, streamed, tail = text.rpartition("    apply: {engine: stream}\n")  # the last source's: crm
    assert streamed, "the demo config applies its sources by the stream engine"
    elsewhere.write_text(head + "    apply: {engine: windows}\n" + tail)
    config = load_config(elsewhere)
    assert main(["--config", str(elsewhere), "config", "check"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(lines) == {t.key for t in config.tables}
    for table in config.tables:
        line = lines[table.key]
        if config.streamed(table):
            assert f"apply=stream partition={table.changelog.partition}" in line and "window=" not in line, line
        else:
            assert f"apply=windows window={table.changelog.window}" in line, line
    assert any(not config.streamed(t) for t in config.tables) and any(config.streamed(t) for t in config.tables)


def test_a_missing_config_is_one_clear_error(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["current", "--all"]) == 2  # ./cdc_platform.yaml does not exist here
    assert "file not found" in capsys.readouterr().err


def test_verify_without_a_source_password_fails_before_starting_spark(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Spark session (and no wait for one) to learn that a password is missing."""

    def no_spark(*_args: Any) -> None:
        raise AssertionError("Spark was started before the sources' passwords were checked")

    monkeypatch.setattr("cdc_platform.lake.session.get_spark_session", no_spark)
    monkeypatch.delenv("CDC_PG_PASSWORD", raising=False)
    assert main(["verify", "shop.public.products", "--config", str(elsewhere)]) == 1
    err = capsys.readouterr().err
    assert "CDC_PG_PASSWORD is not set" in err and "export CDC_PG_PASSWORD=" in err


def test_the_code_location_is_built_lazily_from_the_configured_path(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    monkeypatch.setenv("CDC_PLATFORM_CONFIG", str(elsewhere.parent / "nope.yaml"))
    module = importlib.reload(importlib.import_module("cdc_platform.definitions"))  # importing builds nothing
    with pytest.raises(ConfigError, match="file not found"):
        module.defs()
    monkeypatch.setenv("CDC_PLATFORM_CONFIG", str(elsewhere))
    built = module.defs()
    assert isinstance(built, dg.Definitions)
    resources = built.resources or {}
    assert resources["ledger"].config_path == str(elsewhere.resolve())  # a path, never a secret


def test_definitions_build_without_services_or_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    with warnings.catch_warnings():  # the daemon logs every warning at each load, per table
        warnings.simplefilter("error", dg.BetaWarning)
        defs = build_definitions(DEMO_CONFIG)
    groups = {spec.group_name for spec in defs.resolve_all_asset_specs()}
    assert "shop_customers" in groups and "crm_accounts" in groups
    assert {s.name for s in defs.sensors or []} >= {"changelog_windows", "rehydration", "cdc_run_failures"}


def test_a_streamed_source_is_applied_by_its_stream_not_by_window_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """shop streamed, the others by windows: the changelog sensor asks windows of crm's tables only,
    shop's current runs on a cadence for its checks and has a freshness policy, and shop's
    changelog has a partition per day and refuses a run."""
    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    windows = re.sub(r"(?m)^    apply: \{engine: stream\}", "    apply: {engine: windows}", DEMO_CONFIG.read_text())
    windows = re.sub(r"(?m)^(  - name: crm\.crm\.accounts)$", r"\1\n    changelog: {window: 5m}", windows)
    shop_streamed = "    apply: {engine: stream}"  # the first source's: shop
    text, count = re.subn(r"(?m)^    apply: \{engine: windows\}", shop_streamed, windows, count=1)
    assert count == 1
    config = tmp_path / "cdc_platform.yaml"
    config.write_text(text)
    defs = build_definitions(config)
    sensor = next(s for s in defs.sensors or [] if s.name == "changelog_windows")
    targeted = {t.job_name for t in sensor.targets}
    assert "crm__accounts__changelog_job" in targeted and not any(n.startswith("shop") for n in targeted), targeted
    specs = {s.key.to_user_string(): s for s in defs.resolve_all_asset_specs()}
    assert specs["shop/customers"].automation_condition is not None
    assert "checks every 10m" in str(specs["shop/customers"].automation_condition.get_label())
    assert "after a new generation" in str(specs["crm/accounts"].automation_condition.get_label())
    changelog = next(
        a for a in defs.assets or []
        if isinstance(a, dg.AssetsDefinition) and dg.AssetKey(["shop", "customers", "changelog"]) in a.keys
    )  # fmt: skip
    # one partition per day the stream wrote (it adds them): none before it, at most 366 a year
    days = changelog.partitions_def
    assert isinstance(days, dg.DynamicPartitionsDefinition) and days.name == "shop_customers_changelog_days"
    assert specs["shop/customers"].freshness_policy is not None and specs["crm/accounts"].freshness_policy is None
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(days.name, ["2026-11-25"])
        with pytest.raises(dg.Failure, match=r"written by the stream apply.*cdc-platform apply --source shop"):
            dg.materialize([changelog], partition_key="2026-11-25", resources=defs.resources, instance=instance)


def test_a_streamed_current_is_checked_every_ten_minutes_while_only_its_changelog_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In continuous mode the stream apply materializes the changelog and current; the
    snapshot moves only with a new generation. The check cadence was Dagster's
    ``on_cron``, which also waits for *every* dependency to be updated since the tick, the
    snapshot included: after the first tick no check run was ever requested, and current's
    checks stayed unevaluated for the life of the demo. Nor may the apply's own runless
    materializations count as the tick handled."""
    from datetime import UTC, datetime

    from dagster._core.test_utils import freeze_time

    from cdc_platform.orchestration.keys import changelog_asset_key, current_asset_key, snapshot_asset_key

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    defs = build_definitions(DEMO_CONFIG)  # every demo source streamed
    table = next(t for t in load_config(DEMO_CONFIG).tables if t.key == "shop.public.customers")
    current = current_asset_key(table)
    selection = dg.AssetSelection.assets(current)

    def at(hour: int, minute: int, second: int = 0) -> datetime:
        return datetime(2026, 11, 28, hour, minute, second, tzinfo=UTC)

    def report(key: dg.AssetKey, partition: str | None = None) -> None:
        if key == current:  # the apply observes current; only the run that checks it materializes it
            instance.report_runless_asset_event(dg.AssetObservation(asset_key=key))
        else:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=partition))

    def requested(when: datetime, cursor: Any) -> tuple[bool, Any]:
        with freeze_time(when):
            result = dg.evaluate_automation_conditions(defs, instance, asset_selection=selection, cursor=cursor)
        return any(r.key == current and r.true_subset.size > 0 for r in result.results), result.cursor

    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("shop_customers_generations", ["g1"])
        instance.add_dynamic_partitions("shop_customers_changelog_days", ["2026-11-28"])
        with freeze_time(at(9, 55)):  # the first generation, and the apply building current from it
            report(snapshot_asset_key(table), "g1")
            report(changelog_asset_key(table), "2026-11-28")
            report(current)
        _, cursor = requested(at(9, 56), None)
        for tick in (10, 20, 30):  # the apply reports every minute, once between the tick and the evaluation
            for minute in range(tick - 9, tick + 1):
                with freeze_time(at(10, minute, 15)):
                    report(changelog_asset_key(table), "2026-11-28")
                    report(current)
            due, cursor = requested(at(10, tick, 30), cursor)
            assert due, f"no check run requested after the 10:{tick} tick"
            again, cursor = requested(at(10, tick, 45), cursor)
            assert not again, "requested twice for one tick"


def test_a_table_checked_hourly_is_checked_on_the_hour_and_its_freshness_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tables[].checks.every``: completeness reads the whole source table, so a big table
    is checked less often; its freshness policy (a checked version) follows the period."""
    from datetime import UTC, datetime, timedelta

    from dagster._core.test_utils import freeze_time

    from cdc_platform.orchestration.keys import current_asset_key

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    text, count = re.subn(
        r"(?m)^(  - name: shop\.public\.orders)$", r"\1\n    checks: {every: 1h}", DEMO_CONFIG.read_text()
    )
    assert count == 1
    config = tmp_path / "cdc_platform.yaml"
    config.write_text(text)
    defs = build_definitions(config)
    table = load_config(config).table("shop.public.orders")
    current = current_asset_key(table)
    policy = {s.key: s for s in defs.resolve_all_asset_specs()}[current].freshness_policy
    assert isinstance(policy, dg.FreshnessPolicy)
    assert policy.fail_window.to_timedelta() == timedelta(hours=2, minutes=5)  # type: ignore[attr-defined]

    def requested(when: datetime, cursor: Any) -> tuple[bool, Any]:
        with freeze_time(when):
            result = dg.evaluate_automation_conditions(
                defs, instance, asset_selection=dg.AssetSelection.assets(current), cursor=cursor
            )
        return any(r.key == current and r.true_subset.size > 0 for r in result.results), result.cursor

    with dg.DagsterInstance.ephemeral() as instance:
        _, cursor = requested(datetime(2026, 11, 28, 9, 56, tzinfo=UTC), None)
        verdicts = []
        for hour, minute in ((10, 0), (10, 10), (10, 20), (11, 0)):
            due, cursor = requested(datetime(2026, 11, 28, hour, minute, 30, tzinfo=UTC), cursor)
            verdicts.append(due)
        assert verdicts == [True, False, False, True]  # on the hour only


def test_the_apply_keeps_the_checked_version_the_latest_materialization(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster counts a check's result only for the materialization it followed. The apply
    used to materialize current every minute, so within a minute of a check run its results
    counted for nothing: the asset showed "0 / 4 Passed", a failed check vanished, and a
    downstream asset waiting for current's blocking checks was never requested. The apply
    now observes current; the run that checks it materializes it."""
    from datetime import UTC, datetime

    from cdc_platform.lake.apply import TableApplied
    from cdc_platform.lake.current import CurrentResult
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.keys import KEYS_CHECK, SCHEMA_CHECK, current_asset_key
    from cdc_platform.orchestration.reporting import RunlessReporter

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    config = load_config(DEMO_CONFIG)
    table = next(t for t in config.tables if t.key == "shop.public.orders")
    current = current_asset_key(table)

    @dg.asset(
        key=["user", "orders_report"],
        deps=[current],
        automation_condition=dg.AutomationCondition.missing()
        & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    )
    def orders_report() -> None: ...

    defs = dg.Definitions.merge(build_definitions(DEMO_CONFIG), dg.Definitions(assets=[orders_report]))
    report_key = dg.AssetKey(["user", "orders_report"])

    def downstream_requested() -> bool:
        result = dg.evaluate_automation_conditions(defs, instance, asset_selection=dg.AssetSelection.assets(report_key))
        return any(r.key == report_key and r.true_subset.size > 0 for r in result.results)

    blocking = [dg.AssetCheckSpec(name, asset=current, blocking=True) for name in (SCHEMA_CHECK, KEYS_CHECK)]

    @dg.multi_asset(specs=[dg.AssetSpec(current)], check_specs=blocking)
    def checked_current() -> Iterator[Any]:  # what the 10-minute run yields, for this test's purpose
        yield dg.MaterializeResult(asset_key=current)
        for spec in blocking:
            yield dg.AssetCheckResult(asset_key=current, check_name=spec.name, passed=True)

    with dg.DagsterInstance.ephemeral() as instance:
        assert dg.materialize([checked_current], instance=instance).success  # the check run
        assert downstream_requested()
        # the apply goes on: a batch a second later, reported at once (its first report)
        reporter = RunlessReporter(instance, [lake_table(config, table)], position=str)
        result = CurrentResult("g1", False, 5, 10, {0: 5}, 123, datetime.now(UTC), 0.1)
        reporter([TableApplied(table.key, batch="b", current=result, offsets_behind=0)])
        assert downstream_requested()


def test_jars_come_from_a_setting_with_a_pinned_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.config.model import SparkConfig

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    assert jar_settings(SparkConfig()) == {"spark.jars.packages": ",".join(PINNED_PACKAGES)}
    (tmp_path / "delta-spark_2.13-4.4.0.jar").write_bytes(b"")
    conf = session_conf(SparkConfig(jars_dir=str(tmp_path)))
    assert conf["spark.jars"].endswith("delta-spark_2.13-4.4.0.jar") and "spark.jars.packages" not in conf


def test_the_long_running_apply_gets_a_larger_driver_heap_unless_the_config_sets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At Spark's default 1g the demo's apply driver collected garbage most of the time after
    12-18 minutes and then ran out of memory; Dagster runs and commands keep the default."""
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import long_running_conf
    from cdc_platform.orchestration.resources import CdcSparkResource

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    assert long_running_conf(SparkConfig())["spark.driver.memory"] == "2g"
    assert "spark.driver.memory" not in session_conf(SparkConfig())
    mine = SparkConfig(conf={"spark.driver.memory": "6g"})
    assert long_running_conf(mine)["spark.driver.memory"] == "6g"
    config = tmp_path / "cdc_platform.yaml"
    config.write_text(DEMO_CONFIG.read_text())
    assert CdcSparkResource.for_config(str(config), long_running=True).spark_config["spark.driver.memory"] == "2g"
    assert "spark.driver.memory" not in CdcSparkResource.for_config(str(config)).spark_config


def test_the_driver_maps_the_class_archive_built_for_its_java_and_pyspark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every session's driver JVM maps the class archive bootstrap built beside the jars, once
    it exists; an archive of another pyspark is not used; a user's own options come after
    ours, so theirs win."""
    import pyspark

    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import DRIVER_JAVA_OPTIONS, class_archive

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    jars = tmp_path / "jars dir" / "spark"
    jars.mkdir(parents=True)
    spark = SparkConfig(jars_dir=str(jars))
    assert "SharedArchiveFile" not in session_conf(spark)[DRIVER_JAVA_OPTIONS]  # not built yet: as usual
    archive = class_archive(spark)
    assert archive is not None and archive.parent == jars.parent / "spark-class-archive"
    archive.parent.mkdir()
    archive.write_bytes(b"")
    assert session_conf(spark)[DRIVER_JAVA_OPTIONS].startswith(f'"-XX:SharedArchiveFile={archive}" ')  # quoted
    mine = SparkConfig(master="spark://h:7077", jars_dir=str(jars), conf={DRIVER_JAVA_OPTIONS: "-Xss4m"})
    assert session_conf(mine)[DRIVER_JAVA_OPTIONS] == f'"-XX:SharedArchiveFile={archive}" -Xss4m'
    # class sharing of their own: only theirs (with ours beside -XX:ArchiveClassesAtExit the
    # JVM refuses to start: "DynamicDumpSharedSpaces is unsupported when base CDS archive is
    # not loaded")
    for theirs in ("-Xshare:off", "-XX:ArchiveClassesAtExit=/t/a.jsa", "-Xss4m -XX:SharedArchiveFile=/t/b.jsa"):
        cds = SparkConfig(master="spark://h:7077", jars_dir=str(jars), conf={DRIVER_JAVA_OPTIONS: theirs})
        assert session_conf(cds)[DRIVER_JAVA_OPTIONS] == theirs
    monkeypatch.setattr(pyspark, "__file__", "/elsewhere/pyspark/__init__.py")  # another install: its jars' paths
    assert class_archive(spark) != archive and "SharedArchiveFile" not in session_conf(spark)[DRIVER_JAVA_OPTIONS]
    monkeypatch.undo()
    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    assert class_archive(spark) == archive
    monkeypatch.setattr(pyspark, "__version__", "9.9.9")  # another Spark: its classes are not these
    assert class_archive(spark) != archive and "SharedArchiveFile" not in session_conf(spark)[DRIVER_JAVA_OPTIONS]
    assert class_archive(SparkConfig()) is None  # no jars directory (packages from Maven Central): none


def test_a_local_driver_runs_the_parallel_collector_and_lazier_c2_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local mode: the driver's JVM does all the work, and G1 spent a sixth of a history test in
    pauses; C2 compiled lukewarm code with a fifth of the process's CPU. A cluster's driver
    keeps Java's defaults. A collector the user names is the only one (two, and the JVM
    refuses to start); their JIT thresholds come after ours, so theirs win."""
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import DRIVER_JAVA_OPTIONS

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    lazier_c2 = (
        "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
        "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
    )
    for master in ("local", "local[2]", "local[*]"):
        assert session_conf(SparkConfig(master=master))[DRIVER_JAVA_OPTIONS] == f"-XX:+UseParallelGC {lazier_c2}"
    for master in ("spark://h:7077", "local-cluster[2,1,1024]"):
        assert DRIVER_JAVA_OPTIONS not in session_conf(SparkConfig(master=master))
    for theirs in ("-XX:+UseG1GC -Xss4m", "-XX:+UseZGC"):
        chosen = session_conf(SparkConfig(master="local[2]", conf={DRIVER_JAVA_OPTIONS: theirs}))
        assert chosen[DRIVER_JAVA_OPTIONS] == f"{lazier_c2} {theirs}"
    theirs = "-XX:Tier4InvocationThreshold=7000"
    chosen = session_conf(SparkConfig(master="local[2]", conf={DRIVER_JAVA_OPTIONS: theirs}))
    assert chosen[DRIVER_JAVA_OPTIONS].endswith(f"-XX:Tier4BackEdgeThreshold=400000 {theirs}")  # the last one counts


def test_a_local_driver_shuffles_into_partitions_its_threads_can_run_and_keeps_generated_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local mode: two shuffle partitions per task thread (8 on 2 threads cost a history test a
    fifth of its CPU), and room for many tables' generated code; a cluster keeps 8, and the
    user's own setting wins."""
    from cdc_platform.config.model import SparkConfig

    monkeypatch.delenv("CDC_SPARK_JARS_DIR", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    partitions = "spark.sql.shuffle.partitions"
    expected = {"local": "2", "local[2]": "4", "local[*]": "6", "local[4, 2]": "8", "spark://h:7077": "8"}
    assert {master: session_conf(SparkConfig(master=master))[partitions] for master in expected} == expected
    assert session_conf(SparkConfig(master="local[2]", conf={partitions: "16"}))[partitions] == "16"
    assert session_conf(SparkConfig(master="local[2]"))["spark.sql.codegen.cache.maxEntries"] == "2000"
    assert "spark.sql.codegen.cache.maxEntries" not in session_conf(SparkConfig(master="spark://h:7077"))


def test_an_installed_package_loads_its_code_location_anywhere(tmp_path: Path) -> None:
    """The package copied away from the checkout (as a wheel installs it) still loads."""
    site = tmp_path / "site"
    shutil.copytree(REPO_ROOT / "cdc_platform", site / "cdc_platform", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "CDC_SPARK_JARS_DIR"}
    code = (
        "import cdc_platform, cdc_platform.definitions as d; print(cdc_platform.__file__); print(len(d.defs().assets))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(site), "CDC_PLATFORM_CONFIG": str(DEMO_CONFIG)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    where, assets = result.stdout.split()
    assert where.startswith(str(site)) and int(assets) == 40


def test_long_running_processes_log_info_without_alembics_start_up_lines() -> None:
    # the apply opens the Dagster instance it reports to: alembic's dozen INFO lines at
    # every start buried the apply log's own lines (a process of its own: logging is global)
    import subprocess
    import sys

    script = (
        "import logging; from cdc_platform.cli.main import configure_process_logging; "
        "configure_process_logging(); logging.getLogger('alembic.runtime.migration').info('Context impl SQLiteImpl.'); "
        "logging.getLogger('alembic.runtime.migration').warning('alembic warns'); "
        "logging.getLogger('cdc_platform.apply').info('batch applied')"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    assert "batch applied" in out and "alembic warns" in out
    assert "SQLiteImpl" not in out


def test_a_local_driver_rebuilds_delta_state_in_one_task_unless_the_user_chose() -> None:
    """Each task of Delta's state rebuild generates the code of its nested actions anew: in
    local mode, where the lake's tables are small in files, one task per state; a cluster
    keeps four, and the user's setting wins either way."""
    from cdc_platform.config.model import SparkConfig

    key = "spark.databricks.delta.snapshotPartitions"
    for master in ("local", "local[2]", "local[*]"):
        assert session_conf(SparkConfig(master=master))[key] == "1"
    assert session_conf(SparkConfig(master="spark://h:7077"))[key] == "4"
    assert session_conf(SparkConfig(master="local[2]", conf={key: "8"}))[key] == "8"


def test_the_demo_instance_reads_its_storage_password_from_the_stack_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """dagster.yaml: Dagster's storage in the dev stack's PostgreSQL, as the role the stack
    provisions, its password by the name the stack's env file gives it (never in the file)."""
    import yaml
    from dagster._core.instance.config import dagster_instance_config

    from cdc_platform.devtools.stack import PROFILES
    from cdc_platform.devtools.stack.postgres import DAGSTER_ROLE, PASSWORD_ENVS

    db = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())["storage"]["postgres"]["postgres_db"]
    assert db["password"] == {"env": PASSWORD_ENVS[DAGSTER_ROLE]}
    assert (db["hostname"], db["port"], db["username"], db["db_name"]) == (
        "127.0.0.1", PROFILES["dev"].pg_port, DAGSTER_ROLE, DAGSTER_ROLE,
    )  # fmt: skip
    monkeypatch.setenv(PASSWORD_ENVS[DAGSTER_ROLE], "x")
    config, _ = dagster_instance_config(str(REPO_ROOT))  # Dagster's own schema accepts it
    assert "postgres" in config["storage"]


def test_a_driver_keeps_a_bounded_number_of_delta_logs_unless_the_config_says_otherwise() -> None:
    """Delta keeps every table's log it touched for an hour (up to 10 000): a driver applying
    200 tables filled its heap with them and collected garbage for good. Every session of
    the platform bounds them; a user's own ``spark.conf`` wins."""
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import DELTA_LOG_CACHE_SIZE, long_running_conf

    key = "spark.databricks.delta.delta.log.cacheSize"
    assert session_conf(SparkConfig())[key] == long_running_conf(SparkConfig())[key] == str(DELTA_LOG_CACHE_SIZE)
    assert 3 * 10 < DELTA_LOG_CACHE_SIZE < 1000  # the demo's ten tables' three Delta tables each stay cached
    assert session_conf(SparkConfig(conf={key: "500"}))[key] == "500"
