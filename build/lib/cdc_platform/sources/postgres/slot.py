"""The replication slot: the one place that asks PostgreSQL about it.

The slot's confirmed position is capture's source offset: PostgreSQL keeps WAL from it,
and a restarted capture resumes there. Helpers take an open connection and plain values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_platform.envelope.lsn import parse_lsn

Connection = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True)
class SlotState:
    name: str
    plugin: str
    confirmed: int  # confirmed_flush_lsn: every change before it is in Kafka
    wal_status: str  # reserved | extended | unreserved | lost
    active_pid: int | None
    lag_bytes: int  # WAL retained behind the confirmed position
    current_wal: int  # the server's position now


def read_slot(conn: Connection, slot: str) -> SlotState | None:
    row = conn.execute(
        """SELECT plugin, confirmed_flush_lsn::text, wal_status, active_pid,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, pg_current_wal_lsn()::text
           FROM pg_replication_slots WHERE slot_name = %s""",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    plugin, confirmed, wal_status, active_pid, lag, current = row
    return SlotState(
        slot,
        str(plugin),
        parse_lsn(str(confirmed)) if confirmed else 0,
        str(wal_status),
        int(active_pid) if active_pid is not None else None,
        int(lag or 0),
        parse_lsn(str(current)),
    )


def create_slot(conn: Connection, slot: str) -> int:
    row = conn.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)).fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def drop_slot(conn: Connection, slot: str, terminate_user: bool = False) -> None:
    """Drop the slot (first ending the backend that streams from it, if asked)."""
    if terminate_user:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL",
            (slot,),
        )
        _wait_until_released(conn, slot)
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,))


def _wait_until_released(conn: Connection, slot: str, timeout_s: float = 10.0) -> None:
    """A terminated backend lets go of its slot a moment later; dropping before that fails
    with 'replication slot ... is active'."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is None or row[0] is None:
            return
        time.sleep(0.1)


def current_wal_position(conn: Connection) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))
