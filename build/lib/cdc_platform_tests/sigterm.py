"""A pytest plugin: SIGTERM (a CI timeout, a supervisor stopping the job) ends the run like
Ctrl-C. pytest then runs the teardowns, so the services the session started are stopped;
if a teardown hangs, the process exits anyway after ``TERM_GRACE_S``."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import pytest

TERM_GRACE_S = 120.0
EXIT_TERMINATED = 143


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    timer = threading.Timer(TERM_GRACE_S, lambda: os._exit(EXIT_TERMINATED))
    timer.daemon = True
    timer.start()
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
