"""A test run that receives SIGTERM (CI's timeout) ends promptly and runs its teardowns,
so the services the session started are stopped, not left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cdc_platform_tests.conftest import REPO_ROOT

SESSION = """
import time
import pytest

@pytest.fixture(scope="session")
def service(tmp_path_factory):
    open({started!r}, "w").close()
    yield
    open({stopped!r}, "w").write("teardown ran")

def test_long(service):
    time.sleep(120)
"""


def test_sigterm_runs_the_teardowns_and_ends_the_run(tmp_path: Path) -> None:
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    (tmp_path / "test_session.py").write_text(SESSION.format(started=str(started), stopped=str(stopped)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cdc_platform_tests.sigterm",
         str(tmp_path / "test_session.py")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the session did not start"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert stopped.read_text() == "teardown ran", output
    assert proc.returncode != 0  # interrupted, not passed
