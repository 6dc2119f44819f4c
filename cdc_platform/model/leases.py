"""Who may apply a source's tables: one holder at a time per apply group (pure).

The stream apply keeps its tables' pipeline state in memory between micro-batches (the
ledger is written as it goes, but read only when the process starts or a table fails),
the way a Structured Streaming query owns its checkpoint. Two applies on one source would
each plan batches the other cannot see, and Delta's idempotent writes would then drop one
of two different batches that share a number: a silent hole. So a source is applied by
one holder, recorded in the ledger's ``leases`` as rows (held / released, heartbeats):

* a holder is **alive** while its newest row says held and either it runs on this host
  and its process exists and started before the holder took the lease (a SIGKILLed apply
  is replaced at once, also when the kernel has given its pid to a newer process), or its
  last heartbeat is younger than ``ttl_s`` (another host: only time tells);
* of the live holders, the one that took the lease **first** holds it; a later one gives
  up with the holder's identity in the error (like a second streaming query on one
  checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

LEASE_TTL_S = 120.0
HEARTBEAT_S = 30.0
DEFAULT_GROUP = "default"  # config.model.DEFAULT_APPLY_GROUP: a source's tables without apply_group


def apply_scope(source: str, group: str) -> str:
    """The lease over one apply group's tables. An apply of a whole source takes every
    group's, so it and an apply of one group cannot run at once. The default group's is
    named after the source alone (``apply:<source>``, as before groups existed)."""
    return f"apply:{source}" if group == DEFAULT_GROUP else f"apply:{source}/{group}"


def describe_scope(scope: str) -> str:
    source, _, group = scope.removeprefix("apply:").partition("/")
    return f"source '{source}'" + (f" (apply group '{group}')" if group else "")


class LeaseState(StrEnum):
    HELD = "held"
    RELEASED = "released"


@dataclass(frozen=True)
class LeaseEvent:
    scope: str  # e.g. "apply:shop"
    holder: str  # unique per process: host, pid and a random tag
    host: str
    pid: int
    state: LeaseState
    at: datetime


@dataclass(frozen=True)
class Holder:
    holder: str
    host: str
    pid: int
    since: datetime  # its first row
    seen: datetime  # its newest row

    def describe(self, now: datetime) -> str:
        return f"pid {self.pid} on {self.host}, last heard of {(now - self.seen).total_seconds():.0f} s ago"


# (host, pid, when the holder took the lease) -> True/False when this host can tell, None
# when it cannot (another host)
ProcessCheck = Callable[[str, int, datetime], bool | None]


def live_holders(events: Iterable[LeaseEvent], now: datetime, alive: ProcessCheck, ttl_s: float) -> list[Holder]:
    """The holders that still hold the lease, the earliest taker first."""
    first: dict[str, datetime] = {}
    newest: dict[str, LeaseEvent] = {}
    for event in sorted(events, key=lambda e: e.at):
        first.setdefault(event.holder, event.at)
        newest[event.holder] = event
    holders = []
    for name, event in newest.items():
        if event.state is not LeaseState.HELD:
            continue
        local = alive(event.host, event.pid, first[name])
        if local is False or (local is None and (now - event.at).total_seconds() > ttl_s):
            continue
        holders.append(Holder(name, event.host, event.pid, first[name], event.at))
    return sorted(holders, key=lambda h: (h.since, h.holder))
