"""Pid files and process checks: we stop only processes we started and recorded."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def write_pid(pid_file: Path, pid: int) -> None:
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{pid}\n")


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def recorded_process(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and its command line contains
    ``marker`` (so a recycled pid of some other program is never touched)."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid) or marker not in cmdline(pid):
        return None
    return pid


def terminate(pid: int, timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def stop_recorded(pid: int | None, pid_file: Path, timeout_s: float = 30.0) -> bool:
    """Stop the process a service recorded (``running_pid``'s answer) and forget its pid file;
    False when there was none to stop."""
    if pid is None:
        return False
    terminate(pid, timeout_s=timeout_s)
    pid_file.unlink(missing_ok=True)
    return True


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
