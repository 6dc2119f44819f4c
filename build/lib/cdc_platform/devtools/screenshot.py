"""Screenshots of the running Dagster UI with Debian's chromium (headless, loopback only).

Used by the UI test and by ``make screenshot`` (the README's picture of the demo).
Returns the rendered page's text too, so a test can check what the page shows.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # runs as root in CI containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # nothing but the loopback UI is contacted
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


class ScreenshotError(RuntimeError):
    pass


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise ScreenshotError("chromium is not installed; run: apt-get install chromium (scripts/bootstrap.sh does)")
    return path


def capture_page(url: str, out: Path, width: int = 1600, height: int = 1000, wait_ms: int = 15000) -> str:
    """Screenshot ``url`` into ``out`` (PNG) once its scripts ran; returns the page's text."""
    with tempfile.TemporaryDirectory(prefix="cdc-chromium-") as profile:
        common = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={wait_ms}"]
        shot = subprocess.run(
            [*common, f"--window-size={width},{height}", f"--screenshot={out}", url],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if shot.returncode != 0 or not out.exists():
            raise ScreenshotError(f"chromium could not screenshot {url}: {shot.stderr[-2000:]}")
        dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=False)
    if dom.returncode != 0:
        raise ScreenshotError(f"chromium could not render {url}: {dom.stderr[-2000:]}")
    return re.sub(r"<[^>]+>", " ", dom.stdout)
