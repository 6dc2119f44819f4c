"""Counting py4j round trips from this process to the Spark driver's JVM: what building
Spark SQL columns costs before any Spark job runs (a test and ``bench/bench_decode_build.py``)."""

from __future__ import annotations

from typing import Any

from py4j import clientserver  # type: ignore[import-untyped]


class RoundTrips:
    """The py4j commands this process sends to the JVM while it is entered."""

    def __init__(self) -> None:
        self.count = 0
        self._send = clientserver.ClientServerConnection.send_command

    def __enter__(self) -> RoundTrips:
        send = self._send

        def counted(connection: Any, command: str) -> Any:
            self.count += 1
            return send(connection, command)

        clientserver.ClientServerConnection.send_command = counted
        return self

    def __exit__(self, *exc: object) -> None:
        clientserver.ClientServerConnection.send_command = self._send
