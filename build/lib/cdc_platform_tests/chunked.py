"""Helpers for tests of chunked (incremental) generations."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from cdc_platform.devtools.lake import Lake


def when_half_written(lake: Lake, key: str, generation: str, process: subprocess.Popen[Any]) -> tuple[Any, set[int]]:
    """The generation's plan and recorded chunks once half of them are recorded."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, "the generation ended before half of its chunks were written"
        progress = lake.ledger.chunk_progress(key, generation)
        if progress.plan is not None and len(progress.written) * 2 >= len(progress.plan.predicates):
            return progress.plan, set(progress.written)
        time.sleep(0.1)
    raise AssertionError("half of the chunks were not written within 300 s")
