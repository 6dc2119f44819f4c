"""Where polling of each table stands: the cursor, stored in a compacted Kafka topic.

Like Kafka Connect's offset topic: one record per table (key ``{"source", "table"}``),
written only after Kafka acknowledged every event of the batch it follows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cdc_platform.kafka.clients import KafkaClients


@dataclass
class TableCursor:
    """Where polling of one table stands; the record stored in the offsets topic."""

    mode: str
    timestamp: str | None = None  # the timestamp column's value, as DATE_FORMAT prints it
    incrementing: int | None = None
    max_incrementing: int | None = None  # highest incrementing value ever published (c vs u)
    position: int = 0  # the last position published
    rows: int = 0  # rows published so far
    initialized: bool = False  # False: no poll has run yet (initial: latest still to apply)
    # database clock (ns) at the start of the latest poll that read to the end of the table:
    # every change committed before it is in Kafka (what `verify` waits for)
    caught_up_at: int = 0
    committed_at: str | None = None
    stopped: bool = False  # written by a poller as it exited: no poll follows until one starts
    # database clock (ns) when the latest poller started: alive from then on, before its
    # first read to the end (a check must not take a poller just started for a dead one)
    started_at: int = 0

    def alive_at(self) -> int:
        """The latest database time a poller was seen running for this table."""
        return max(self.caught_up_at, self.started_at)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("timestamp", self.timestamp), ("incrementing", self.incrementing)) if v]
        return ", ".join(parts) or "start"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def cursor_key(source: str, table_key: str) -> bytes:
    return json.dumps({"source": source, "table": table_key}, separators=(",", ":")).encode()


def read_stored_cursors(kafka: KafkaClients, topic: str, source: str) -> dict[str, TableCursor]:
    """table key -> newest stored cursor, from the source's compacted offsets topic."""
    found: dict[str, TableCursor] = {}
    for key, value in kafka.latest_values(topic, f"offsets.{source}").items():
        parsed = json.loads(key or b"{}")
        if parsed.get("source") == source and value is not None:
            found[str(parsed["table"])] = TableCursor(**json.loads(value))
    return found
