"""Pure pieces of the local stack scripts: what they hand to the services they start."""

from __future__ import annotations

import uuid

import pytest

from cdc_platform.devtools.stack import kafka


def test_a_kraft_cluster_id_never_reads_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # 16 random bytes in base64url start with '-' one time in 64; kafka-storage's argument
    # parser then takes the id for an option and formatting fails (a CI run died on it).
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" + bytes(15))])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    cluster_id = kafka.new_cluster_id()
    assert not cluster_id.startswith("-")
    assert len(cluster_id) == 22


def test_kraft_cluster_ids_are_random() -> None:
    assert len({kafka.new_cluster_id() for _ in range(200)}) == 200


def test_no_two_stack_profiles_share_a_port_or_a_directory() -> None:
    """The test suite's two stacks run beside a demo that may be up (scripts/test.sh):
    a port or a data directory in common and one would stop or overwrite another's."""
    from cdc_platform.devtools.stack import PROFILES
    from cdc_platform.devtools.stack.spark_cluster import LocalSparkCluster

    profiles = list(PROFILES.values())
    ports = []
    for p in profiles:
        cluster = LocalSparkCluster(p)
        ports += [p.pg_port, p.kafka_port, p.controller_port, p.kafka_sasl_port, p.mariadb_port, p.connect_port]
        ports += [cluster.master_port, cluster.master_ui_port, cluster.worker_port, cluster.worker_ui_port]
    assert len(ports) == len(set(ports)), ports
    assert len({p.root for p in profiles}) == len(profiles)
    assert {"dev", "test", "serial"} <= set(PROFILES)
