"""Connections to the captured PostgreSQL sources."""

from __future__ import annotations

import dagster as dg
import psycopg
from psycopg.conninfo import make_conninfo
from pydantic import Field

from cdc_platform.config import PlatformConfig, PostgresSource


class PostgresConnection(dg.Config):
    host: str
    port: int
    database: str
    user: str
    # Set from dg.EnvVar(<password_env>): the UI shows the variable's name, never its value.
    password: str = Field(repr=False)
    connect_options: dict[str, str] = Field(default_factory=dict)


class PostgresSourcesResource(dg.ConfigurableResource["PostgresSourcesResource"]):
    """One connection description per configured source, keyed by source name."""

    sources: dict[str, PostgresConnection]

    def connect(self, source: str) -> psycopg.Connection[tuple[object, ...]]:
        c = self.sources[source]
        return psycopg.connect(
            make_conninfo("", **c.connect_options),  # libpq options such as sslmode
            host=c.host,
            port=c.port,
            dbname=c.database,
            user=c.user,
            password=c.password,
            autocommit=True,
            connect_timeout=10,
            application_name="cdc_platform",
        )

    @classmethod
    def from_config(cls, config: PlatformConfig) -> PostgresSourcesResource:
        return cls(
            sources={
                name: PostgresConnection(
                    host=src.host,
                    port=src.port,
                    database=src.database,
                    user=src.user,
                    password=dg.EnvVar(src.password_env),
                    connect_options=dict(src.connect_options),
                )
                for name, src in config.sources.items()
                if isinstance(src, PostgresSource)
            }
        )
