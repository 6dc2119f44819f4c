"""``cdc-platform apply`` as a user runs it, in a process of its own so that fault
injection can SIGKILL it or cut it at a named crash point (``lake/crash_points.py``).

Its output goes to one log file; ``wait_for_batch`` reads the log from where this start
began, so a test knows the process is applying (not still starting Spark) before it
kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cdc_platform.lake.crash_points import APPLY_POINTS
from cdc_platform.lake.crash_points import ENV as CRASH_POINT_ENV

KILLED = 137  # what a crash point exits with, as a SIGKILLed process's shell status would read
# How long a freshly started apply may take to log its first batch: a cold driver's start,
# its first plans and JIT, and a current rebuilt from a generation. A bound on liveness, not
# on speed: on CI's 2 cores beside two other Spark drivers the first batch of a fresh
# clone's fault suite took 158 s (2026-12-02), and 180 s failed a run that was only slow.
FIRST_BATCH_TIMEOUT_S = 360.0


class ApplyExited(RuntimeError):
    """The apply process ended on its own (it should run until stopped)."""


class ApplyProcess:
    def __init__(self, config_path: Path, source: str, log_path: Path, env: dict[str, str]) -> None:
        self.config_path, self.source, self.log_path, self.env = config_path, source, log_path, env
        self.process: subprocess.Popen[bytes] | None = None
        self.log_start = 0  # the log's size when the running process started

    def start(self, *args: str, crash_point: str | None = None) -> None:
        """Start it, with more CLI ``args`` (``--once``); ``crash_point``: it exits with 137 the
        first time a batch reaches that step."""
        if crash_point is not None and crash_point not in APPLY_POINTS:
            raise ValueError(f"unknown crash point {crash_point!r}; choose from {', '.join(APPLY_POINTS)}")
        environment = {k: v for k, v in {**os.environ, **self.env}.items() if k != CRASH_POINT_ENV}
        if crash_point is not None:
            environment[CRASH_POINT_ENV] = crash_point
        cli = Path(sys.executable).parent / "cdc-platform"
        command = [str(cli), "apply", "--config", str(self.config_path), "--source", self.source, *args]
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)

    @property
    def exit_code(self) -> int | None:
        """None while it runs (or before it was started)."""
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for_batch(self, timeout_s: float = FIRST_BATCH_TIMEOUT_S) -> None:
        """Until this start logged an applied batch: it reads, decodes and writes by now."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ApplyExited(f"apply exited with {self.exit_code} before applying a batch:\n{self.tail()}")
            if b" batch " in self._log_since_start():
                return
            time.sleep(0.2)
        raise TimeoutError(f"apply applied no batch within {timeout_s:.0f} s:\n{self.tail()}")

    def wait_exit(self, timeout_s: float = 180.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: no cleanup; whatever was half-written stays."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=60)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (the batch in flight finishes), SIGKILL if it does not end in time."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def _log_since_start(self) -> bytes:
        if not self.log_path.exists():
            return b""
        with self.log_path.open("rb") as handle:
            handle.seek(self.log_start)
            return handle.read()

    def tail(self, chars: int = 3000) -> str:
        return self._log_since_start()[-chars:].decode(errors="replace")
