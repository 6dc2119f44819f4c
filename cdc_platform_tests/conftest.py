"""Shared fixtures. Integration tests run against the real `test` stack (PostgreSQL,
Kafka and MariaDB on 127.0.0.1:5434/9192/3308, data in .cdc/test/), which this session
starts if it is not running and stops afterwards only if it started it. A service that
cannot start is an error for every test that needs it, never a skip.

Test layers: everything under ``integration/``, ``spark/`` and ``dagster/``, and every
test that asks for a service fixture (``stack``, ``spark``, …), is marked
``integration``. ``pytest -m "not integration"`` is the fast layer: no service, no jars.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.stack import PROFILES, StackProfile, stack_down, stack_status, stack_up
from cdc_platform.devtools.stack.stack import load_stack_env

# SIGTERM (a CI timeout) ends the run like Ctrl-C, so teardowns stop the stack
pytest_plugins = ["cdc_platform_tests.sigterm"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# the stack the tests run against: ``test``, or ``serial`` for the tests that restart its
# services, which scripts/test.sh runs first, on a stack of their own
TEST_PROFILE = os.environ.get("CDC_TEST_PROFILE", "test")
INTEGRATION_DIRS = ("integration", "spark", "dagster")
SERVICE_FIXTURES = {
    "stack", "demo_db", "spark", "demo_config_path", "capture_password", "connect", "spark_cluster", "s3_store",
    "kafka_cluster",
}  # fmt: skip

# the Spark-side jars scripts/bootstrap.sh resolved (a config's spark.jars_dir wins)
os.environ.setdefault("CDC_SPARK_JARS_DIR", str(REPO_ROOT / ".cdc" / "jars" / "spark"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs a service, by where it lives and what it asks for (the
    services started on demand are shared by the workers: ``_started_on_demand``). Then the
    ``long_running`` tests first: pytest-xdist hands out tests in this order, so a test of
    minutes that came late would run alone while the other worker had nothing left (the
    longest job first keeps the two workers' ends close)."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO_ROOT / "cdc_platform_tests").parts
        fixtures = set(getattr(item, "fixturenames", ()))
        if parts[0] in INTEGRATION_DIRS or fixtures & SERVICE_FIXTURES:
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("long_running") is None)  # stable: the rest keep their order


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under ``--dist loadgroup`` a test whose ``xdist_group`` did not reach its node id
    fails: the scheduler spread its group over both workers, and the tests of the demo's
    fixed slot would run at once, failing by chance. pytest-xdist 3.8 marks the group in
    ``item._nodeid``, which pytest 9.2 no longer reads."""
    grouped = getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group")
    if grouped and "@" not in item.nodeid:
        pytest.fail(
            "pytest-xdist's xdist_group did not reach this test's id, so its group may run on both "
            "workers at once: this pytest and pytest-xdist do not work together; install the versions "
            "pyproject.toml pins (scripts/bootstrap.sh)",
            pytrace=False,
        )


@contextmanager
def _one_worker_at_a_time(profile: StackProfile, name: str) -> Iterator[None]:
    """Under pytest-xdist, workers take turns (starting the stack, setting up the demo
    databases): a file lock in the profile's directory."""
    profile.root.mkdir(parents=True, exist_ok=True)
    with (profile.root / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _files_holding(roots: list[Path], secrets: list[bytes], skip: set[Path]) -> list[str]:
    """Every file under ``roots`` holding one of ``secrets``. grep reads the files (a worker's
    lakes, logs and Dagster instances: Python took 25-30 s at the end of each worker); the
    secrets go to it on stdin, never on a command line another process could read."""
    existing = [str(root) for root in roots if root.exists()]
    if not existing:
        return []
    listed = subprocess.run(
        ["grep", "-rlF", "--binary-files=binary", "-f", "-", *existing],
        input=b"\n".join(secrets) + b"\n",
        capture_output=True,
        check=False,
    )
    if listed.returncode not in (0, 1):  # 1: nothing found; 2: errors, of which a file gone mid-read is fine
        errors = [line for line in listed.stderr.decode(errors="replace").splitlines() if "No such file" not in line]
        assert not errors, "the secret scan could not read: " + "\n".join(errors[:20])
    found = []
    for name in listed.stdout.decode().splitlines():
        path = Path(name)
        if path in skip:
            continue
        data = path.read_bytes()
        found += [f"{path} holds secret #{i}" for i, secret in enumerate(secrets) if secret in data]
    return found


@pytest.fixture(scope="session", autouse=True)
def dagster_home_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite never writes into the demo's Dagster instance (the Makefile exports
    ``DAGSTER_HOME`` = the repo, whose dagster.yaml stores in the dev stack's PostgreSQL):
    whatever a test starts that reports to ``$DAGSTER_HOME`` (``cdc-platform apply``, runs
    it launches) gets an instance of this session. Tests that read an instance set their own."""
    home = tmp_path_factory.mktemp("dagster_home")
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("DAGSTER_HOME", None)
    else:
        os.environ["DAGSTER_HOME"] = previous


@pytest.fixture(scope="session", autouse=True)
def no_secret_in_anything_the_suite_wrote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every test: the stack's passwords (and the S3 store's secret key) appear in no
    file the suite produced — Dagster instances (runs, events, compute logs), lakes (local
    and on the S3 store), ledgers, configs, service and process logs — except the 0600
    secrets file the stack keeps them in."""
    yield
    from cdc_platform.devtools.stack.kafka import KAFKA_PASSWORD_ENV
    from cdc_platform.devtools.stack.mariadb import MARIADB_PASSWORD_ENVS
    from cdc_platform.devtools.stack.postgres import PASSWORD_ENVS
    from cdc_platform.devtools.stack.s3proxy import SECRET_ACCESS_KEY_ENV, LocalS3Store

    names = [*PASSWORD_ENVS.values(), *MARIADB_PASSWORD_ENVS.values(), KAFKA_PASSWORD_ENV, SECRET_ACCESS_KEY_ENV]
    secrets = [os.environ[name].encode() for name in names if os.environ.get(name)]
    if not secrets:
        return  # no stack was used (the fast layer)
    profile = PROFILES[TEST_PROFILE]
    roots = [tmp_path_factory.getbasetemp(), profile.logs, LocalS3Store(profile).data]  # and lakes on the S3 store
    leaks = _files_holding(roots, secrets, skip={profile.env_file})
    assert not leaks, "a password was written where it must never be:\n" + "\n".join(leaks[:20])


@pytest.fixture(scope="session")
def stack() -> Iterator[StackProfile]:
    profile = PROFILES[TEST_PROFILE]
    with _one_worker_at_a_time(profile, "stack"):
        already_up = {name for name, state in stack_status(profile).items() if state.startswith("up")}
        try:
            started = stack_up(profile)
        except Exception as exc:  # surface the stack's own message (it names the log file)
            if not already_up:
                stack_down(profile)  # stop what this session started, even half-way
            pytest.fail(f"the test stack could not start: {exc}", pytrace=False)
    load_stack_env(profile)
    try:
        yield profile
    finally:
        # a worker of several must not stop the stack under the others (scripts/test.sh
        # starts it before the workers and stops it after them)
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if (started.started_kafka or started.started_postgres or started.started_mariadb) and not worker:
            stack_down(profile)


@pytest.fixture(scope="session")
def demo_db(stack: StackProfile) -> StackProfile:
    """The shop and bench demo databases on the test stack."""
    from cdc_platform.devtools.demo.setup import setup_demo

    with _one_worker_at_a_time(stack, "demo_db"):  # idempotent, but not when two run at once
        list(setup_demo(stack, pgbench_scale=1, seed_customers=50))
    return stack


def write_config(path: Path, profile: StackProfile, tables: str) -> Path:
    path.write_text(
        f"""
sources:
  shop:
    host: 127.0.0.1
    port: {profile.pg_port}
    database: shop
    user: cdc_capture
    password_env: CDC_PG_PASSWORD
    apply: {{engine: windows}}
  bench:
    port: {profile.pg_port}
    database: bench
    user: cdc_capture
    password_env: CDC_PG_PASSWORD
    apply: {{engine: windows}}
kafka:
  bootstrap_servers: {profile.kafka_bootstrap}
lake:
  root: lake
tables:
{tables}
"""
    )
    return path


DEMO_TABLES = """
  - name: shop.public.customers
  - name: shop.public.products
  - name: shop.public.orders
  - name: shop.public.order_lines
  - name: shop.public.payments
  - name: shop.public.audit_events
    primary_key: [event_id]
  - name: bench.public.pgbench_accounts
"""


@contextmanager
def _started_on_demand(service: Any, error: type[Exception], what: str, grouped: bool = False) -> Iterator[None]:
    """``service`` up for the session (a loud failure naming ``what`` if it cannot start),
    and down afterwards if this session started it, unless this is a pytest-xdist worker.

    A worker's session ends when it runs out of tests, while the other worker's test may
    still use the service: the S3 store stopped that way under the S3 test (grouping a
    service's tests on one worker would serialize tests that can share it). Under xdist,
    ``cdc-platform dev down`` (scripts/test.sh runs it at the end) stops what a worker
    started; workers take turns starting it. A service whose tests all run on one worker
    (``grouped``: one ``xdist_group``, the fixture scoped to them) is stopped after them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") if not grouped else None
    try:
        with _one_worker_at_a_time(service.profile, type(service).__name__):  # nor two workers start it twice
            started = service.up()
    except error as exc:
        pytest.fail(f"{what} could not start: {exc}", pytrace=False)
    try:
        yield
    finally:
        if started and not worker:
            service.down()


@pytest.fixture(scope="session")
def connect(stack: StackProfile) -> Iterator[Any]:
    """Kafka Connect with the Debezium PostgreSQL connector on the test stack (started on
    first use; stopped afterwards if this session started it). Yields its REST client."""
    from cdc_platform.devtools.stack.connect import ConnectError, LocalConnect

    worker = LocalConnect(stack)
    with _started_on_demand(worker, ConnectError, "Kafka Connect"):
        yield worker.rest


@pytest.fixture(scope="session")
def spark_cluster(stack: StackProfile) -> Iterator[Any]:
    """A Spark standalone cluster (a master and one worker) on the test stack, started on
    first use and stopped afterwards if this session started it. Yields the
    ``LocalSparkCluster``; a config names it with ``spark.master: <master_url>``."""
    from cdc_platform.devtools.stack.spark_cluster import LocalSparkCluster, SparkClusterError

    cluster = LocalSparkCluster(stack)
    with _started_on_demand(cluster, SparkClusterError, "the Spark cluster"):
        yield cluster


@pytest.fixture(scope="module")
def kafka_cluster(stack: StackProfile) -> Iterator[Any]:
    """A three-node Kafka cluster (KRaft; three replicas, two in sync) on the test stack,
    started for the module that uses it and stopped after it if it started it (its modules
    are one ``xdist_group``, "kafka_cluster"): idle, its three nodes cost a tenth of a core,
    which the rest of the run would pay. Yields the ``LocalKafkaCluster``; a config names
    it with ``bootstrap_servers: <bootstrap>``."""
    from cdc_platform.devtools.stack.kafka_cluster import KafkaClusterError, LocalKafkaCluster

    cluster = LocalKafkaCluster(stack)
    with _started_on_demand(cluster, KafkaClusterError, "the Kafka cluster", grouped=True):
        yield cluster


@pytest.fixture(scope="session")
def s3_store(stack: StackProfile) -> Iterator[Any]:
    """An S3-compatible store (S3Proxy) on the test stack, started on first use and stopped
    afterwards if this session started it. Yields the ``LocalS3Store``; a config's lake
    names it with ``root: s3a://…`` and ``s3: {endpoint: …}``."""
    from cdc_platform.devtools.stack.s3proxy import LocalS3Store, S3StoreError

    store = LocalS3Store(stack)
    if store.running_pid() is None:  # nobody uses it: earlier sessions' lakes go (this one's stay for the secret scan)
        shutil.rmtree(store.data, ignore_errors=True)
    with _started_on_demand(store, S3StoreError, "the S3 store (S3Proxy)"):
        yield store


@pytest.fixture
def demo_config_path(demo_db: StackProfile, tmp_path: Path) -> Path:
    return write_config(tmp_path / "cdc_platform.yaml", demo_db, DEMO_TABLES)


@pytest.fixture
def capture_password(stack: StackProfile) -> str:
    return os.environ["CDC_PG_PASSWORD"]


# Spark's own test switch between generated and interpreted projections. A task of a
# tiny test table spent more CPU generating the code of its projections (Delta's nested
# actions above all) than running them: interpreted, the suite's Spark work costs about a
# fifth less CPU (docs/benchmarks.md). Tests marked ``spark_codegen`` (the value cases)
# run generated code, as production does; so do the processes the tests start.
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"


@pytest.fixture(scope="session")
def spark() -> Any:
    """One local Spark session for every test that needs Spark (getOrCreate shares it with
    the PySpark resource of in-process Dagster runs), on interpreted projections."""
    from cdc_platform.config.model import SparkConfig
    from cdc_platform.lake.session import get_spark_session

    # the JVM's environment is fixed at its launch, and Java's Kafka client reads the stack's
    # secrets from it (``${env:…}``, kafka/java_client.py) as a deployment's JVM would
    load_stack_env(PROFILES[TEST_PROFILE])
    return get_spark_session(SparkConfig(master="local[2]", conf={CODEGEN_FACTORY_MODE: "NO_CODEGEN"}))


@pytest.fixture(autouse=True)
def _no_quiet_fallback_to_sparks_merge() -> Iterator[None]:
    """A current the driver merges (``lake.driver_merge``) that delta-rs refused is merged by
    Spark from then on, with a warning: in the suite that is a bug to see, not a path to take
    quietly. A test that means to be refused empties ``refused`` itself."""
    from cdc_platform.lake import driver_merge

    yield
    refused = dict(driver_merge.refused)
    driver_merge.refused.clear()
    assert not refused, f"delta-rs refused to merge in the driver: {refused}"


@pytest.fixture(autouse=True)
def _spark_codegen(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``spark_codegen`` runs Spark's generated projections (production's)."""
    if request.node.get_closest_marker("spark_codegen") is None:
        yield
        return
    spark = request.getfixturevalue("spark")
    spark.conf.set(CODEGEN_FACTORY_MODE, "FALLBACK")
    try:
        yield
    finally:
        spark.conf.set(CODEGEN_FACTORY_MODE, "NO_CODEGEN")
