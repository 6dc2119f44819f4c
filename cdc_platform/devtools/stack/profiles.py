"""Stack profiles: the demo's ``dev`` stack and the test suite's ``test`` and ``serial``
stacks never share ports or data, so running the tests cannot disturb a demo that is up,
and the serial tests (which restart Kafka and PostgreSQL) cannot disturb the others."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def state_root() -> Path:
    """``.cdc/`` in the repo (override with CDC_STATE_DIR, e.g. on a read-only checkout)."""
    return Path(os.environ.get("CDC_STATE_DIR") or REPO_ROOT / ".cdc")


@dataclass(frozen=True)
class StackProfile:
    name: str
    pg_port: int
    kafka_port: int
    controller_port: int
    mariadb_port: int
    # Kafka Connect's REST port (the Debezium producer; started on demand, see stack/connect.py)
    connect_port: int
    # a Spark standalone master's port (started on demand, see stack/spark_cluster.py); its web
    # UI, the worker's port and the worker's UI take the next three
    spark_master_port: int
    # an S3-compatible store's port (S3Proxy, started on demand, see stack/s3proxy.py)
    s3_port: int
    # a three-node Kafka cluster's first port (started on demand, see stack/kafka_cluster.py):
    # each node a broker port and a controller port, six in all
    kafka_cluster_port: int
    # fsync off makes the throwaway test cluster several times faster; never for dev data
    pg_fsync: bool = True

    @property
    def root(self) -> Path:
        return state_root() / self.name

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def env_file(self) -> Path:
        """Generated secrets for this stack (mode 0600), as ``export NAME=value`` lines."""
        return self.root / "env"

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def kafka_sasl_port(self) -> int:
        """The broker's SASL_SSL (SCRAM-SHA-512) listener: TLS and a client that authenticates,
        as on a production cluster (user ``KAFKA_SASL_USER``, password ``$CDC_KAFKA_PASSWORD``,
        the broker's certificate in ``kafka_ca_file``)."""
        return self.kafka_port + 2

    @property
    def kafka_ca_file(self) -> Path:
        """The PEM certificate clients of the SASL_SSL listener trust (self-signed, made by ``dev up``)."""
        return self.root / "kafka" / "tls" / "ca.pem"

    @property
    def kafka_sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_sasl_port}"

    @property
    def connect_url(self) -> str:
        return f"http://127.0.0.1:{self.connect_port}"

    @property
    def spark_master_url(self) -> str:
        return f"spark://127.0.0.1:{self.spark_master_port}"


PROFILES = {
    "dev": StackProfile(
        "dev",
        pg_port=5433,
        kafka_port=9092,
        controller_port=9093,
        mariadb_port=3307,
        connect_port=8083,
        spark_master_port=7077,
        s3_port=9444,
        kafka_cluster_port=9350,
    ),
    "test": StackProfile(
        "test",
        pg_port=5434,
        kafka_port=9192,
        controller_port=9193,
        mariadb_port=3308,
        connect_port=8183,
        spark_master_port=7177,
        s3_port=9544,
        kafka_cluster_port=9360,
        pg_fsync=False,
    ),
    # the serial tests' own stack: they restart its services, so they run beside the rest
    # of the suite instead of after it (scripts/test.sh; CDC_TEST_PROFILE selects it)
    "serial": StackProfile(
        "serial",
        pg_port=5435,
        kafka_port=9292,
        controller_port=9293,
        mariadb_port=3309,
        connect_port=8283,
        spark_master_port=7277,
        s3_port=9644,
        kafka_cluster_port=9370,
        pg_fsync=False,
    ),
}


def profile(name: str) -> StackProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown stack profile '{name}'; use one of: {', '.join(PROFILES)}") from None
