"""Pure pieces of the local stack scripts: what they hand to the services they start."""

from __future__ import annotations

import uuid
from pathlib import Path

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


def test_a_kafka_cluster_started_cold_is_a_new_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No node running: the nodes start from freshly formatted data, not the last cluster's.
    Its brokers' registrations outlive a node killed before its controlled shutdown, and a
    node restarted on that data exited with DUPLICATE_BROKER_REGISTRATION while the others
    still listed it, so the cluster passed as ready with one node gone (a test's loopback
    check found node 1's port closed). A node that died in a running cluster restarts on
    its data, as a broker does."""
    from cdc_platform.devtools.stack import PROFILES, kafka_cluster
    from cdc_platform.devtools.stack.kafka_cluster import LocalKafkaCluster

    monkeypatch.setenv("CDC_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(kafka_cluster, "port_open", lambda _host, _port: False)  # a stack up here is not ours
    cluster = LocalKafkaCluster(PROFILES["test"])
    stale = cluster.root / "node-2" / "data" / "stale-topic-0"
    stale.mkdir(parents=True)
    (cluster.root / "node-1" / "data").mkdir(parents=True)
    (cluster.root / "node-1" / "data" / "meta.properties").write_text("cluster.id=old\n")
    calls: list[str] = []
    monkeypatch.setattr(cluster, "running_pids", lambda: {})
    monkeypatch.setattr(cluster, "_format", lambda: calls.append("format"))
    monkeypatch.setattr(cluster, "start", lambda node: calls.append(f"start {node}"))
    monkeypatch.setattr(cluster, "wait_ready", lambda timeout_s=0: calls.append("ready"))
    assert cluster.up()
    assert calls == ["format", "start 1", "start 2", "start 3", "ready"]
    assert not stale.exists()

    calls.clear()  # node 2 died; 1 and 3 run
    (cluster.root / "node-2" / "data").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(cluster, "running_pids", lambda: {1: 101, 3: 103})
    assert cluster.up()
    assert calls == ["start 2", "ready"]
