"""Dagster resources: they own every call to the outside (the ledger, Kafka, the sources,
Spark). Each is configured by the path of the platform's config file, so the UI shows a
path and never a secret: secrets are read from the environment when a connection is made.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.object_store import give_session_object_store
from cdc_platform.lake.session import (
    check_jars,
    long_running_conf,
    prepare_spark_environment,
    quiet_known_noise,
    session_conf,
)
from cdc_platform.lake.tables import LakeTable, lake_table
from cdc_platform.sources import Source, open_source


@functools.lru_cache(maxsize=8)
def _loaded(path: str, mtime_ns: int) -> PlatformConfig:
    return load_config(path)


def cached_config(path: str) -> PlatformConfig:
    """The config at ``path``, loaded once per process (again when the file changes)."""
    return _loaded(path, Path(path).stat().st_mtime_ns)


class PlatformConfigResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The config file every other resource reads its part of."""

    config_path: str

    @property
    def config(self) -> PlatformConfig:
        return cached_config(self.config_path)

    def table(self, key: str) -> LakeTable:
        return lake_table(self.config, self.config.table(key))


class LedgerResource(PlatformConfigResource):
    """The pipeline-state ledger in the lake (``lake/ledger.py``)."""

    def ledger(self) -> Ledger:
        return Ledger(self.config.lake.root)


class KafkaResource(PlatformConfigResource):
    """Kafka's offsets and topics, through the one client factory."""

    def clients(self) -> KafkaClients:
        return KafkaClients(self.config.kafka)


class SourcesResource(PlatformConfigResource):
    """The source databases behind the ``Source`` interface (one connector per source)."""

    _sources: dict[str, Source] = PrivateAttr(default_factory=dict)

    def source(self, name: str) -> Source:
        if name not in self._sources:
            self._sources[name] = open_source(self.config, name)
        return self._sources[name]

    def names(self) -> list[str]:
        return sorted(self.config.sources)


class CdcSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session with the platform's conf; the jars are checked when
    the session starts (not when the code location loads)."""

    config_path: str

    def _init_session(self) -> None:
        if self._spark_session is not None:
            return
        config = cached_config(self.config_path)
        check_jars(config.spark)
        prepare_spark_environment()
        super()._init_session()
        quiet_known_noise(self.spark_session)  # set now: the property does not come back here
        give_session_object_store(self.spark_session, config.lake)

    @classmethod
    def for_config(cls, config_path: str, long_running: bool = False) -> CdcSparkResource:
        """``long_running``: the stream apply's process (a larger driver heap, ``lake.session``)."""
        config = cached_config(config_path)
        conf = (long_running_conf if long_running else session_conf)(config.spark, config.lake)
        return cls(config_path=config_path, spark_config=conf)


def platform_resources(config_path: str) -> dict[str, Any]:
    return {
        "ledger": LedgerResource(config_path=config_path),
        "kafka": KafkaResource(config_path=config_path),
        "sources": SourcesResource(config_path=config_path),
        "pyspark": CdcSparkResource.for_config(config_path),
    }
