"""A three-node Kafka cluster (KRaft, each node a broker and a controller) from the stack's
Kafka jars: the cluster a config's ``kafka.bootstrap_servers`` names with
``replication_factor: 3``, so that capture, the offset questions and the stream apply are
tested against replicated topics, leaders that move and a broker that dies, not only
against the single node every other test uses.

Plain listeners on loopback only; topics get three replicas and need two in sync
(``min.insync.replicas=2``), as a production cluster is set up. Started and stopped by pid
like the single node; started on demand (the tests' ``kafka_cluster`` fixture), stopped by
``cdc-platform dev down``. Node ``i`` (1-3) listens on ``kafka_cluster_port + 2(i-1)`` and
its controller on the next port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from cdc_platform.devtools.stack.kafka import LOG4J2_PROPERTIES, _classpath, _java, new_cluster_id
from cdc_platform.devtools.stack.procs import is_alive, port_open, read_pid, recorded_process, terminate, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile

NODES = (1, 2, 3)
REPLICAS, MIN_IN_SYNC = 3, 2


class KafkaClusterError(RuntimeError):
    pass


class LocalKafkaCluster:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "kafka-cluster"
        self.log4j = self.root / "log4j2.properties"

    def broker_port(self, node: int) -> int:
        return self.profile.kafka_cluster_port + 2 * (node - 1)

    def controller_port(self, node: int) -> int:
        return self.broker_port(node) + 1

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.broker_port(n)}" for n in NODES)

    def props(self, node: int) -> Path:
        return self.root / f"node-{node}" / "server.properties"

    def pid_file(self, node: int) -> Path:
        return self.profile.pids / f"kafka-cluster-{node}.pid"

    def log(self, node: int) -> Path:
        return self.profile.logs / f"kafka-cluster-{node}.log"

    def running_pids(self) -> dict[int, int]:
        found = {}
        for node in NODES:
            pid = recorded_process(self.pid_file(node), str(self.props(node)))
            if pid is not None:
                found[node] = pid
        return found

    def up(self, timeout_s: float = 120.0) -> bool:
        """Start every node that is not running, then wait until all three serve metadata.
        Returns True if this call started any."""
        running = self.running_pids()
        missing = [n for n in NODES if n not in running]
        for node in missing:
            for port in (self.broker_port(node), self.controller_port(node)):
                if port_open("127.0.0.1", port):
                    raise KafkaClusterError(
                        f"port 127.0.0.1:{port} (Kafka cluster node {node}) is taken by a process this stack did "
                        "not start; stop it, or run this profile elsewhere"
                    )
        if len(missing) == len(NODES):
            # a cold start is a new cluster: the last one held only the tests' own topics, and
            # its brokers' registrations outlive a node killed before its controlled shutdown:
            # a node restarted on that data exited with DUPLICATE_BROKER_REGISTRATION while the
            # others still listed it. A node that died in a running cluster keeps its data.
            for node in NODES:
                shutil.rmtree(self.root / f"node-{node}" / "data", ignore_errors=True)
            self._format()
        for node in missing:
            self.start(node)
        self.wait_ready(timeout_s)
        return bool(missing)

    def down(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM to every node at once, SIGKILL to those still running after ``timeout_s``.
        One node at a time took 34 s: the last ones' controlled shutdown waited for a quorum
        that was already gone."""
        running = self.running_pids()
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node, pid in running.items():
            terminate(pid, timeout_s=max(0.0, deadline - time.monotonic()))
            self.pid_file(node).unlink(missing_ok=True)
        return bool(running)

    def kill(self, node: int) -> None:
        """SIGKILL one node, as a machine that dies: no controlled shutdown, no leader handover."""
        pid = self.running_pids().get(node)
        if pid is None:
            raise KafkaClusterError(f"Kafka cluster node {node} is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pid_file(node).unlink(missing_ok=True)

    def start(self, node: int) -> None:
        log = self.log(node)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self._jvm("kafka.Kafka", str(self.props(node))),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root, env={**os.environ, "KAFKA_HEAP_OPTS": ""},
            )  # fmt: skip
        write_pid(self.pid_file(node), proc.pid)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until every running node's pid lives and the cluster lists all three brokers."""
        from confluent_kafka.admin import AdminClient

        deadline, last = time.monotonic() + timeout_s, "no answer"
        while time.monotonic() < deadline:
            for node in NODES:
                pid = read_pid(self.pid_file(node))
                if pid is None or not is_alive(pid):
                    raise KafkaClusterError(f"Kafka cluster node {node} exited during startup; see {self.log(node)}")
            try:
                brokers = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(timeout=3)
                if len(brokers.brokers) == len(NODES):
                    return
                last = f"{len(brokers.brokers)} of {len(NODES)} brokers"
            except Exception as exc:  # librdkafka raises KafkaException while the nodes boot
                last = str(exc)
            time.sleep(0.5)
        raise KafkaClusterError(f"the Kafka cluster {self.bootstrap} was not ready within {timeout_s:.0f} s ({last})")

    def _write_config(self, node: int) -> None:
        voters = ",".join(f"{n}@127.0.0.1:{self.controller_port(n)}" for n in NODES)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node)},"
            f"CONTROLLER://127.0.0.1:{self.controller_port(node)}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node)}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.root / f"node-{node}" / "data"),
            "num.partitions": "3",
            "default.replication.factor": str(REPLICAS),
            "min.insync.replicas": str(MIN_IN_SYNC),
            "offsets.topic.replication.factor": str(REPLICAS),
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": str(REPLICAS),
            "transaction.state.log.min.isr": str(MIN_IN_SYNC),
            "share.coordinator.state.topic.replication.factor": str(REPLICAS),
            "share.coordinator.state.topic.min.isr": str(MIN_IN_SYNC),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # a dead node's partitions get new leaders within seconds, not Kafka's 18 s default
            "broker.session.timeout.ms": "6000",
            "broker.heartbeat.interval.ms": "1000",
        }
        path = self.props(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _format(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.log4j.write_text(LOG4J2_PROPERTIES)
        cluster_id = new_cluster_id()
        for node in NODES:
            self._write_config(node)
            result = subprocess.run(
                self._jvm("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.props(node))),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise KafkaClusterError(
                    f"formatting Kafka cluster node {node} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}"
                )

    def _jvm(self, main: str, *args: str) -> list[str]:
        return [_java(), "-Xmx384m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.log4j}", "-cp", _classpath(), main, *args]  # fmt: skip
