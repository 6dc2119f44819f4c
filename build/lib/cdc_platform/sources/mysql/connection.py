"""Connections to a polled MariaDB/MySQL source, and its errors classified."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from cdc_platform.config.model import JdbcSource, TableConfig
from cdc_platform.model.errors import CdcError, FatalError, RetriableError

# the database clock, in microseconds since the epoch: positions and watermarks both use it
CLOCK_SQL = "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
_BAD_CREDENTIALS, _UNKNOWN_DATABASE = 1045, 1049
_NO_PRIVILEGE = (1142, 1143, 1044)
_NO_SUCH_TABLE_OR_COLUMN = (1146, 1054)


@dataclass(frozen=True)
class MysqlEndpoint:
    """One polled source as the poller needs it: names resolved, tables and topics."""

    name: str
    config: JdbcSource
    tables: Sequence[TableConfig]
    topics: Mapping[str, str]  # table key -> topic
    server_name: str
    offsets_topic: str  # where stored cursors live (compacted, one record per table)

    def connect(self, purpose: str) -> Any:
        """A PyMySQL connection in a UTC session (TIMESTAMP values read as UTC), autocommit,
        so every poll query sees the newest committed rows. Errors are classified."""
        source = self.config
        try:
            return pymysql.connect(
                host=source.host,
                port=source.port,
                user=source.user,
                password=source.password(self.name).get_secret_value(),
                database=source.database,
                connect_timeout=source.connect_timeout_s,
                autocommit=True,
                charset="utf8mb4",
                init_command="SET time_zone = '+00:00'",
                program_name=f"cdc_platform_{purpose}",
            )
        except pymysql.err.MySQLError as exc:
            raise self.classify(exc) from None

    def classify(self, exc: BaseException) -> CdcError:
        return classify_mysql_error(exc, self.name, self.config)


def classify_mysql_error(exc: BaseException, source_name: str, source: JdbcSource) -> CdcError:
    """Retriable (server down, connection lost) or fatal (credentials, database, privileges)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = " ".join(str(exc.args[1] if len(exc.args) > 1 else exc).split())
    if code == _BAD_CREDENTIALS:
        return FatalError(
            f"source '{source_name}': bad credentials for user {source.user} ({text}); fix sources.{source_name}.user "
            f"or the password in the environment variable named by sources.{source_name}.password_env"
        )
    if code == _UNKNOWN_DATABASE:
        return FatalError(f"source '{source_name}': {text}; fix sources.{source_name}.database")
    if code in _NO_PRIVILEGE:
        return FatalError(
            f"source '{source_name}': user {source.user} may not read the table ({text}); as an admin run: "
            f"GRANT SELECT ON <database>.* TO '{source.user}'@'<host>'"
        )
    if code in _NO_SUCH_TABLE_OR_COLUMN:
        return FatalError(f"source '{source_name}': {text}; fix the table or column names in the config")
    return RetriableError(
        f"source '{source_name}': cannot query {source.host}:{source.port} ({text}); is the database up?"
    )


def database_clock_ns(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(CLOCK_SQL)
        row = cur.fetchone()
    return int(row[0]) * 1000
