"""Dagster resources (ConfigurableResource only; secrets come in as EnvVar)."""

from cdc_platform.resources.jdbc import JdbcConnection, JdbcSourcesResource
from cdc_platform.resources.postgres import PostgresConnection, PostgresSourcesResource

__all__ = ["JdbcConnection", "JdbcSourcesResource", "PostgresConnection", "PostgresSourcesResource"]
