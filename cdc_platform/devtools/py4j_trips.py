"""Counting py4j round trips from this process to the Spark driver's JVM: what building
Spark SQL columns costs before any Spark job runs (a test and ``bench/bench_decode_build.py``)."""

from __future__ import annotations

import threading
from typing import Any

from py4j import clientserver, protocol  # type: ignore[import-untyped]

RELEASE = protocol.MEMORY_COMMAND_NAME + protocol.MEMORY_DEL_SUBCOMMAND_NAME


class RoundTrips:
    """The py4j commands this process sends to the JVM while it is entered."""

    def __init__(self) -> None:
        self.count = 0
        # of which the JVM was told Python let go of an object: Python's garbage collector
        # does that, in whichever thread it runs, whatever that thread is doing
        self.releases = 0
        self.first: list[str] = []  # the first other commands sent, with their thread: what asked the JVM
        self._send = clientserver.ClientServerConnection.send_command

    def __enter__(self) -> RoundTrips:
        send = self._send

        def counted(connection: Any, command: str) -> Any:
            self.count += 1
            if command.startswith(RELEASE):
                self.releases += 1
            elif len(self.first) < 8:
                self.first.append(f"{threading.current_thread().name}: {command[:120]!r}")
            return send(connection, command)

        clientserver.ClientServerConnection.send_command = counted
        return self

    @property
    def asked(self) -> int:
        """The commands that asked the JVM for something (all but the releases)."""
        return self.count - self.releases

    def __exit__(self, *exc: object) -> None:
        clientserver.ClientServerConnection.send_command = self._send
