"""One interface for every kind of source (Debezium's connector split: a snapshot side
and a streaming side, plus what the orchestration asks of a source).

A ``Source`` is one configured source database with its tables. Kinds live in their
own packages (``sources/postgres``, ``sources/mysql``); ``sources.open_source`` picks
the implementation once, from the config's ``kind``. Nothing outside ``sources/`` knows
which kind it talks to: it asks the interface and reads the answers' data.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import SecretStr

from cdc_platform.config.model import TableConfig
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.model.chunks import ChunkPlan
from cdc_platform.model.generations import Watermark
from cdc_platform.model.tables import SourceTable, TableSchema

MetricValue = int | float | str | bool | None


@dataclass(frozen=True)
class Capabilities:
    """What the lake may rely on from a source's change stream."""

    sees_hard_deletes: bool  # False for polling: rows deleted in the source linger until a reconciliation
    exact_snapshot_count: bool  # True when one snapshot holds one consistent state (its count is exact)
    kind_label: str  # 'postgres', 'mariadb', 'mysql': the UI's kind tag
    # True when ``snapshot(consistent=False, resume=plan)`` reads a planned generation's chunks
    # again (``snapshot.mode: incremental``): a generation run again resumes where it stopped
    resumable_snapshots: bool = False


@dataclass(frozen=True)
class ColumnRead:
    """One column of a JDBC snapshot read: what the source evaluates, and how Spark turns
    the JDBC value into the lake type (cast | json_array | hex | utc_text | nonzero |
    unix_date | unix_micros)."""

    name: str
    select_sql: str
    conversion: str = "cast"
    source: str = ""  # the read's result column holding the value, when not ``name``


@dataclass(frozen=True)
class JdbcRead:
    """A parallel Spark JDBC read: one query per predicate (disjoint, covering the table)."""

    url: str
    driver: str
    user: str
    password: SecretStr = field(repr=False)
    source_sql: str  # "(SELECT … FROM …) AS snapshot_source"
    predicates: tuple[str, ...]
    columns: tuple[ColumnRead, ...]
    options: Mapping[str, str] = field(default_factory=dict)  # sessionInitStatement, fetchsize, …


@dataclass(frozen=True)
class SnapshotPlan:
    """Everything a generation's Spark read needs, taken while the source holds the state
    it describes (``Source.snapshot`` is a context manager for that reason)."""

    table: str
    watermark: Watermark
    schema: TableSchema
    read: JdbcRead
    source_rows: int
    schema_hash: str
    described: SourceTable
    # True: every part reads one state, and ``source_rows`` counts that state; False: parts
    # read at their own instants (the watermark's replay makes them converge)
    consistent: bool = True
    resumed: bool = False  # the watermark and chunks are a stored plan's (``model.chunks``)
    # True when the source's own unique index holds the key and each chunk is read in one
    # statement: no chunk can hold a key twice (validation then needs only the chunks' ranges)
    key_unique_per_chunk: bool = False
    # columns the source holds (nearly) unique: a Parquet dictionary of them never pays, so
    # the generation's writer tries none (``lake.tables.parquet_dictionary_off``)
    distinct_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Observation:
    """A source table as observed now, and where capture stands for it."""

    described: SourceTable
    schema: TableSchema
    rows: int
    rows_exact: bool
    capture: Mapping[str, MetricValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Signal:
    """A row of a source's signal table that names tables to rehydrate."""

    cause: str  # "signal:<source>:<id>"
    tables: tuple[str, ...]  # config keys


@dataclass(frozen=True)
class CaptureSilence:
    """How long capture has shown no sign of reading the source to its end (a heartbeat, a
    poll that read a table to the end), and how long a running one is ever silent. A
    capture that died or was never restarted leaves Kafka with nothing new, so a lake
    caught up with Kafka looks fresh while the source moves on: this tells the two apart."""

    seconds: float
    stalled_after_s: float  # no running capture is silent longer (three of its signs missed)
    advice: str  # what to look at and how to start it, for this source's producer

    @property
    def stalled(self) -> bool:
        return self.seconds > self.stalled_after_s


@dataclass(frozen=True)
class CaptureSettings:
    until_caught_up: bool = False  # stop once every change committed before the start is in Kafka
    max_reconnect_wait_s: float = 30.0
    give_up_after_s: float | None = None  # None: retry forever (a long-running worker)
    status_interval_s: float = 10.0
    status_file: Path | None = None
    # Create a new slot even though an earlier one of this source was lost: the caller
    # accepts the gap (the tables get rehydrated by a new snapshot generation).
    new_slot: bool = False


class Capture(Protocol):
    """A long-running capture (streaming or polling): ``run`` until ``stop``."""

    def run(self) -> object: ...

    def stop(self) -> None: ...


class Source(ABC):
    """One source database, its configured tables and their topics."""

    name: str
    capabilities: Capabilities

    @abstractmethod
    def describe(self, table: TableConfig) -> tuple[SourceTable, TableSchema]:
        """The table's catalog description and the resolved schema the lake uses."""

    @abstractmethod
    def observe(self, table: TableConfig) -> Observation: ...

    @abstractmethod
    def position(self) -> int:
        """The source's position now (an LSN, or a database clock)."""

    @abstractmethod
    def format_position(self, position: int) -> str: ...

    @abstractmethod
    def snapshot(
        self, table: TableConfig, kafka: KafkaClients, topic: str, consistent: bool = True,
        resume: ChunkPlan | None = None,
    ) -> AbstractContextManager[SnapshotPlan]:  # fmt: skip
        """Take the watermark, then plan the parts Spark reads in parallel. ``consistent``:
        hold one state of the table for every part (what a comparison needs); otherwise the
        source may let each part read on its own (``snapshot.mode: incremental``). ``resume``:
        a stored plan to read again, kept when the table's shape is still the plan's (a
        source with ``resumable_snapshots``; the plan says ``resumed``)."""

    def prepare_generation(self, reason: str) -> str | None:
        """Whatever the source must do before a generation taken for ``reason`` (a new
        replication slot after the old one was lost); what it did, or None."""
        return None

    @abstractmethod
    def key_read(self, table: TableConfig, key: tuple[str, ...]) -> JdbcRead:
        """A read of the key columns of every row the source holds now."""

    @abstractmethod
    def capture(self, settings: CaptureSettings) -> Capture: ...

    @abstractmethod
    def status(self) -> dict[str, object]:
        """Where capture stands, as the source sees it (for ``capture status``)."""

    @abstractmethod
    def position_lost(self) -> str | None:
        """Why changes were lost at the source (a dropped slot), or None."""

    @abstractmethod
    def signals(self) -> Iterator[Signal]:
        """Rows of the source's signal table, if it has one."""

    def rows_written(self, table: TableConfig) -> int | None:
        """The source's own count of rows written to the table (inserted + updated +
        deleted), for telling a quiet table from an unfed topic; None when the source
        keeps no such count, or its topics are the platform's own polls."""
        return None

    def unfed_cause(self, table: TableConfig) -> str:
        """The likely reason a table's topic gets nothing while the table changes."""
        return "its producer does not capture this table"

    def capture_silences(self) -> Mapping[str, CaptureSilence]:
        """How long capture has shown no sign of reading each table (by key) to the source's
        end, in one ask of the source; tables it cannot tell about are left out (a producer
        configured without heartbeats, a capture that never ran)."""
        return {}

    def confirms_within_s(self) -> float:
        """The longest a running capture may leave a position unconfirmed while its tables
        are quiet: how long a check must be ready to wait before it calls capture silent.
        0 for a capture that confirms as it reads (PostgreSQL's slot)."""
        return 0.0

    @abstractmethod
    def wait_until_captured(self, position: int, deadline: float, stop_when_unread: bool = False) -> str:
        """Wait until every change before ``position`` is in Kafka: '' when it is, else
        why not, with the advice that fits this source. ``stop_when_unread``: give up early
        when the source can tell that nothing reads its changes (a check's evaluation wants a
        prompt answer; ``verify`` waits its whole deadline for a capture that restarts)."""


class CaptureWatch:
    """Capture's silence for each table, asked of its source at most every ``every_s``: a
    stream apply reports hundreds of tables, and each report's fresh check needs it, while
    one ask (the newest heartbeat, or the poller's stored cursors) answers for every table
    of a source. A source that cannot be asked (Kafka or the database out of reach) gives
    no answer for now, logged: the check then goes by Kafka alone, as before, and applying
    goes on."""

    def __init__(
        self, sources: Mapping[str, Source], every_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sources, self.every_s, self.clock = sources, every_s, clock
        self.known: dict[str, tuple[float, Mapping[str, CaptureSilence]]] = {}

    def __call__(self, table: TableConfig) -> CaptureSilence | None:
        now = self.clock()
        asked = self.known.get(table.source)
        if asked is None or now - asked[0] >= self.every_s:
            try:
                silences = self.sources[table.source].capture_silences()
            except Exception as exc:  # a report must not fail on it; the next one asks again
                logging.getLogger("cdc_platform.apply").warning(
                    "source %s: could not tell whether capture runs (%s); its tables' fresh checks go by Kafka alone",
                    table.source, exc,
                )  # fmt: skip
                silences = {}
            asked = self.known[table.source] = (now, silences)
        return asked[1].get(table.key)
