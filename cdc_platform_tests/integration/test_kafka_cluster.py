"""The platform on a three-node Kafka cluster, chosen by config alone
(``kafka.bootstrap_servers`` naming its nodes, ``replication_factor: 3``): the stack's
``kafka_cluster`` (``devtools/stack/kafka_cluster.py``, KRaft, two replicas in sync of
three), where every other test runs against one node.

A generation is taken while a workload writes, then ``cdc-platform apply`` streams what
capture produces. Mid-workload one node is SIGKILLed, as a machine that dies: the
partitions it led get new leaders, and capture (acks from all in-sync replicas, idempotent)
and the apply (Spark's Kafka source) go on through them. The node comes back and catches
up. verify then passes while capture and the apply run, current equals the
source, and every topic the platform created has three replicas.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from cdc_platform.devtools.apply_process import ApplyProcess
from cdc_platform.devtools.lake import Lake
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.integration.streaming import assert_verified, streaming_after_a_generation
from cdc_platform_tests.integration.test_capture_faults import DDL
from cdc_platform_tests.integration.test_stack import LOOPBACK, listening
from cdc_platform_tests.spark.test_apply import STREAMED
from cdc_platform_tests.spark.test_current import assert_current_equals_source

# the cluster is started for this module and stopped after it: its users take one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("kafka_cluster")]


@pytest.fixture
def env(demo_db: Any, tmp_path: Path, kafka_cluster: Any) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["items", "lines"], source_yaml=STREAMED):
        text = env.config_path.read_text()
        single = f"  bootstrap_servers: {demo_db.kafka_bootstrap}\n"
        assert single in text
        cluster = f"  bootstrap_servers: {kafka_cluster.bootstrap}\n  replication_factor: 3\n"
        env.config_path.write_text(text.replace(single, cluster))  # the only change from a single node
        for table in env.tables:
            env.configure_table(table, "snapshot: {chunk_rows: 40, chunks_per_wave: 8}")
        yield env
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        ours = [t for t in admin.list_topics(timeout=10).topics if env.prefix in t]
        for future in admin.delete_topics(ours).values() if ours else ():
            future.result(timeout=30)


def test_the_platform_runs_on_a_kafka_cluster_and_through_a_dead_node(
    env: CaptureEnv, spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    keys = [f"cap.{env.schema}.{t}" for t in env.tables]
    for node in (1, 2, 3):  # loopback only, checked here: the test kills a node below
        for port in (kafka_cluster.broker_port(node), kafka_cluster.controller_port(node)):
            addresses = listening(port)
            assert addresses and set(addresses) <= LOOPBACK, (node, port, addresses)
    lake = Lake(env.config, spark)
    home = tmp_path / "dagster"
    home.mkdir()
    run_env = {**os.environ, "DAGSTER_HOME": str(home)}
    cli = [str(Path(sys.executable).parent / "cdc-platform"), "--config", str(env.config_path)]
    apply = ApplyProcess(env.config_path, "cap", tmp_path / "apply.log", {"DAGSTER_HOME": str(home)})
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    try:
        with streaming_after_a_generation(env, cli, run_env, apply, seed=11) as workload:
            # the node leading the items topic's first partition dies while both stream
            topic = env.topic("items")
            leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
            kafka_cluster.kill(leader)
            moved = _new_leader(admin, topic, dead=leader)  # once the controller fenced the dead node
            workload.wait_for(40)  # capture goes on through the other two
            kafka_cluster.start(leader)
            kafka_cluster.wait_ready()
            workload.wait_for(20)
            workload.stop()
            assert workload.error is None
            assert_verified(lake, keys, apply)  # while capture and the apply run
            applying = apply.alive()  # it ran until stopped: a dead node is not fatal
    finally:
        apply.stop()
    assert applying, apply.tail()
    assert_current_equals_source(lake, keys, at_least=20)
    metadata = admin.list_topics(timeout=10).topics
    created = [name for name in metadata if env.prefix in name]
    assert created and all(len(p.replicas) == 3 for name in created for p in metadata[name].partitions.values()), (
        created
    )
    assert moved != leader


def _new_leader(admin: AdminClient, topic: str, dead: int, timeout_s: float = 60.0) -> int:
    """Partition 0's leader once it is no longer the ``dead`` node (Kafka fences a node that
    stopped heartbeating after broker.session.timeout.ms, then elects from the in-sync rest)."""
    deadline = time.monotonic() + timeout_s
    while True:
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        if leader not in (dead, -1):
            return int(leader)
        assert time.monotonic() < deadline, f"partition 0 of {topic} still led by node {dead} after {timeout_s:.0f} s"
        time.sleep(0.5)
