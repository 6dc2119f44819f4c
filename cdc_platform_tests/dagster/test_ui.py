"""The Dagster UI, running for real (dagster-webserver on loopback) over an instance with a
table's assets materialized, looked at with Debian's headless chromium: the page shows
the table's asset group, its materializations and its passed checks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.config import load_config
from cdc_platform.devtools.screenshot import capture_page
from cdc_platform.orchestration.runs import apply_current, start_generations
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform_tests.conftest import REPO_ROOT, write_config
from cdc_platform_tests.integration.capture_env import running_in_thread

# the shop source's fixed slot (cdc_shop) and the demo tables: these files take turns on one
# worker (scripts/test.sh), and no other test touches them
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("demo_tables")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ui(demo_db: Any, spark: Any, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    config_path = write_config(tmp_path / "cdc.yaml", demo_db, "  - name: shop.public.customers\n    history: true\n")
    config = load_config(config_path)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "CDC_PLATFORM_CONFIG": str(config_path)}
    session_home = os.environ.get("DAGSTER_HOME")  # conftest's instance of the session
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance = dg.DagsterInstance.get()
        [run] = start_generations(config_path, config.tables, reason="bootstrap", instance=instance)
        assert run.success
        shop = open_source(config, "shop").capture(CaptureSettings(status_interval_s=1))
        with running_in_thread(shop):  # its checks compare rows once capture confirms their read
            assert all(ok for _, ok, _ in apply_current(config_path, config.tables, instance))
    finally:
        if session_home is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = session_home
    port = _free_port()
    webserver = Path(sys.executable).parent / "dagster-webserver"
    server = subprocess.Popen(
        [str(webserver), "-h", "127.0.0.1", "-p", str(port), "-w", str(REPO_ROOT / "workspace.yaml")],
        cwd=REPO_ROOT,
        env=env,
        stdout=(tmp_path / "webserver.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/server_info", timeout=2)  # noqa: S310 - our loopback URL
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "webserver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "dagster-webserver did not answer within 120 s"
                time.sleep(1)
        yield base, tmp_path
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_ui_shows_the_table_group_materialized_with_passed_checks(ui: tuple[str, Path]) -> None:
    base, tmp_path = ui
    out = tmp_path / "ui.png"
    text = capture_page(f"{base}/locations/cdc_platform/asset-groups/shop_customers/lineage", out)
    assert out.stat().st_size > 50_000  # a rendered page, not a blank one
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for shown in ("shop_customers", "source", "snapshot", "changelog", "customers", "history", "Materialized"):
        assert shown in text, shown
    assert "4 / 4 Passed" in text  # schema_compatible, keys, changelog_keys, completeness on current
    assert "2 / 2 Passed" in text  # open_versions_match_current and versions_follow_one_another on history
