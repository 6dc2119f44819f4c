"""Sources behind one interface (``base.Source``), one package per kind.

``open_source`` is the one place a source config becomes an implementation: the config
resolved the ``kind`` (a tagged union), this maps the config's class to its connector.
"""

from __future__ import annotations

from cdc_platform.config.model import JdbcSource, PlatformConfig, PostgresSource
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.sources.base import (
    Capabilities,
    CaptureSettings,
    ColumnRead,
    JdbcRead,
    Observation,
    Signal,
    SnapshotPlan,
    Source,
)

__all__ = [
    "Capabilities",
    "CaptureSettings",
    "ColumnRead",
    "JdbcRead",
    "Observation",
    "Signal",
    "SnapshotPlan",
    "Source",
    "open_source",
    "open_sources",
]


def open_source(config: PlatformConfig, name: str, kafka: KafkaClients | None = None) -> Source:
    """The connector for source ``name`` of the config."""
    if name not in config.sources:
        from cdc_platform.model.errors import FatalError

        raise FatalError(f"no source '{name}' in the config (sources: {', '.join(sorted(config.sources))})")
    source = config.sources[name]
    kafka = kafka or KafkaClients(config.kafka)
    tables = [t for t in config.tables if t.source == name]
    topics = {t.key: config.topic_for(t) for t in tables}
    prefix = source.prefix(name)
    if isinstance(source, PostgresSource):
        from cdc_platform.sources.postgres.source import PostgresConnector
        from cdc_platform.sources.postgres.stream import PostgresEndpoint

        endpoint = PostgresEndpoint(
            name, source, tables, topics, slot=source.slot(name),
            publication=source.publication_name(name), heartbeat_topic=f"__debezium-heartbeat.{prefix}",
            server_name=prefix,
        )  # fmt: skip
        return PostgresConnector(endpoint, kafka)
    assert isinstance(source, JdbcSource)
    from cdc_platform.sources.mysql.connection import MysqlEndpoint
    from cdc_platform.sources.mysql.source import MysqlConnector

    return MysqlConnector(MysqlEndpoint(name, source, tables, topics, prefix, f"__cdc-offsets.{prefix}"), kafka)


def open_sources(config: PlatformConfig, kafka: KafkaClients | None = None) -> dict[str, Source]:
    kafka = kafka or KafkaClients(config.kafka)
    return {name: open_source(config, name, kafka) for name in config.sources}
