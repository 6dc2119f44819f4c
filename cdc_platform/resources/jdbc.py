"""Connections to the polled (jdbc) sources: MariaDB/MySQL through PyMySQL."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pymysql
from pydantic import Field

from cdc_platform.config import JdbcSource, PlatformConfig


class JdbcConnection(dg.Config):
    host: str
    port: int
    database: str
    user: str
    # Set from dg.EnvVar(<password_env>): the UI shows the variable's name, never its value.
    password: str = Field(repr=False)
    connect_timeout_s: int = 10


class JdbcSourcesResource(dg.ConfigurableResource["JdbcSourcesResource"]):
    """One connection description per jdbc source, keyed by source name."""

    sources: dict[str, JdbcConnection]

    def connect(self, source: str) -> Any:
        c = self.sources[source]
        return pymysql.connect(
            host=c.host,
            port=c.port,
            user=c.user,
            password=c.password,
            database=c.database,
            connect_timeout=c.connect_timeout_s,
            autocommit=True,
            charset="utf8mb4",
            init_command="SET time_zone = '+00:00'",
            program_name="cdc_platform",
        )

    @classmethod
    def from_config(cls, config: PlatformConfig) -> JdbcSourcesResource:
        return cls(
            sources={
                name: JdbcConnection(
                    host=src.host,
                    port=src.port,
                    database=src.database,
                    user=src.user,
                    password=dg.EnvVar(src.password_env),
                    connect_timeout_s=src.connect_timeout_s,
                )
                for name, src in config.sources.items()
                if isinstance(src, JdbcSource)
            }
        )
