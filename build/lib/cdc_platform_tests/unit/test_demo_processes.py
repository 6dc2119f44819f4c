"""``make status`` and ``make down`` recognise the demo's processes by pid file and start
time, whatever their command line, and never mistake a recycled pid for one of theirs."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from cdc_platform_tests.conftest import REPO_ROOT


def _procs(pids: Path, command: str) -> str:
    script = f"PIDS={pids}; . {REPO_ROOT}/scripts/procs.sh; {command}"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False).stdout.strip()


def test_a_recorded_process_is_alive_whatever_its_command_line(tmp_path: Path) -> None:
    # a capture started with --config before --source (the old check matched one command line)
    proc = subprocess.Popen(["sleep", "60", "--config", "x.yaml", "--source", "shop"])
    try:
        _procs(tmp_path, f"record capture-shop {proc.pid}")
        assert _procs(tmp_path, "alive capture-shop") == str(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert _procs(tmp_path, "alive capture-shop") == ""


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        # the same pid, recorded with another start time: a different process
        (tmp_path / "capture-shop.pid").write_text(f"{proc.pid} 1\n")
        assert _procs(tmp_path, "alive capture-shop") == ""
        assert _procs(tmp_path, "alive nothing-recorded") == ""
    finally:
        proc.kill()
        proc.wait()
