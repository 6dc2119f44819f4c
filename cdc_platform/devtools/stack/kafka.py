"""A single-node KRaft Kafka (broker + controller) from the Maven Central jars that
scripts/bootstrap.sh resolved into ``.cdc/jars/kafka``."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from cdc_platform.devtools.stack.procs import is_alive, port_open, read_pid, recorded_process, stop_recorded, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile, state_root

LOG4J2_PROPERTIES = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


# the SASL listener's user; its password is the stack's generated $CDC_KAFKA_PASSWORD
KAFKA_SASL_USER = "cdc"
KAFKA_PASSWORD_ENV = "CDC_KAFKA_PASSWORD"  # noqa: S105  # a variable's name, not a password
# the broker's TLS key store's password: the broker reads it from its environment (Kafka's
# EnvVarConfigProvider), so it is in no file
KEYSTORE_PASSWORD_ENV = "CDC_KAFKA_KEYSTORE_PASSWORD"  # noqa: S105  # a variable's name
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM-SHA-512


class KafkaError(RuntimeError):
    pass


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding.

    One id in 64 would start with '-', which kafka-storage's argument parser reads as an
    option ("argument --cluster-id/-t: expected one argument"); Kafka's own
    Uuid.randomUuid() draws again in that case, and so do we."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def jars_dir() -> Path:
    return state_root() / "jars" / "kafka"


def _classpath() -> str:
    jars = jars_dir()
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise KafkaError(f"Kafka jars not found in {jars}; run scripts/bootstrap.sh (it resolves them with mvn)")
    return f"{jars}/*"


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise KafkaError("java not found on PATH; run scripts/bootstrap.sh (it installs openjdk-17-jre-headless)")
    return java


def keytool() -> str:
    """The JDK's keytool, beside the java the stack runs."""
    return str(Path(_java()).resolve().parent / "keytool")


class LocalKafka:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "kafka"
        self.data = self.root / "data"
        self.props = self.root / "server.properties"
        self.log4j = self.root / "log4j2.properties"
        self.log = profile.logs / "kafka.log"
        self.pid_file = profile.pids / "kafka.pid"
        self.keystore = self.root / "tls" / "broker.p12"

    def running_pid(self) -> int | None:
        return recorded_process(self.pid_file, str(self.props))

    def up(self, env: dict[str, str], timeout_s: float = 90.0) -> bool:
        """Start the broker if it is not running, and give the SASL listener's user the
        stack's password. Returns True if we started it."""
        started = False
        if self.running_pid() is None:
            for port in (self.profile.kafka_port, self.profile.controller_port, self.profile.kafka_sasl_port):
                if port_open("127.0.0.1", port):
                    raise KafkaError(
                        f"port 127.0.0.1:{port} is taken by a process this stack did not start; "
                        f"stop it, or run the '{self.profile.name}' profile elsewhere"
                    )
            self.root.mkdir(parents=True, exist_ok=True)
            self._ensure_certificate(env)
            self._write_config()
            if not (self.data / "meta.properties").exists():
                self._format()
            self._start(env)
            started = True
        self._wait_ready(timeout_s)
        self._set_sasl_password(env[KAFKA_PASSWORD_ENV])
        return started

    def down(self) -> bool:
        return stop_recorded(self.running_pid(), self.pid_file)

    def _write_config(self) -> None:
        p = self.profile
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{p.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{p.kafka_port},CONTROLLER://127.0.0.1:{p.controller_port},"
                f"SASL://127.0.0.1:{p.kafka_sasl_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p.kafka_port},SASL://127.0.0.1:{p.kafka_sasl_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_SSL",
            # a listener as production clusters have: TLS, and clients that authenticate (SCRAM:
            # the credential lives in the cluster's metadata, set by _set_sasl_password)
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore),
            "ssl.keystore.password": "${env:" + KEYSTORE_PASSWORD_ENV + "}",
            "config.providers": "env",
            "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
            "log.dirs": str(self.data),
            "num.partitions": "3",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # topics are created by the platform with explicit partitions and cleanup policy
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "10000",
            "log.cleaner.backoff.ms": "5000",
        }
        self.props.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log4j.write_text(LOG4J2_PROPERTIES)

    def _set_sasl_password(self, password: str) -> None:
        """The SASL user's SCRAM credential (an upsert: the same on every ``up``)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in __all__
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.profile.kafka_bootstrap, "log_level": 0})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        try:
            upsertion = UserScramCredentialUpsertion(KAFKA_SASL_USER, info, password.encode())
            for future in admin.alter_user_scram_credentials([upsertion]).values():
                future.result(30)
        except Exception as exc:  # the password is not in librdkafka's message
            raise KafkaError(
                f"setting the SASL user's credential on {self.profile.kafka_bootstrap} failed: {exc}"
            ) from None

    def _jvm(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [
            _java(),
            f"-Xmx{heap}",
            "-Xms256m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j}",
            "-cp",
            _classpath(),
            main,
            *args,
        ]

    def _format(self) -> None:
        cluster_id = new_cluster_id()
        result = subprocess.run(
            self._jvm("kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id, "-c", str(self.props)),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise KafkaError(
                f"formatting Kafka storage in {self.data} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}"
            )

    def _ensure_certificate(self, env: dict[str, str]) -> None:
        """The broker's self-signed certificate (for 127.0.0.1 and localhost), made once by
        the JDK's keytool; its PEM is the CA file clients trust (``profile.kafka_ca_file``)."""
        if self.keystore.exists() and self.profile.kafka_ca_file.exists():
            return
        self.keystore.parent.mkdir(parents=True, exist_ok=True)
        self.keystore.unlink(missing_ok=True)
        store = ["-keystore", str(self.keystore), "-storetype", "PKCS12", "-storepass:env", KEYSTORE_PASSWORD_ENV]
        steps = [
            ["-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650",
             "-dname", "CN=localhost", "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-ext", "BC:c=ca:true"],
            ["-exportcert", "-rfc", "-alias", "broker", "-file", str(self.profile.kafka_ca_file)],
        ]  # fmt: skip
        for step in steps:
            result = subprocess.run(
                [keytool(), *step, *store],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, KEYSTORE_PASSWORD_ENV: env[KEYSTORE_PASSWORD_ENV]},
            )
            if result.returncode != 0:
                raise KafkaError(f"keytool {step[0]} for the broker's certificate failed: {result.stderr[-1500:]}")
        self.keystore.chmod(0o600)  # the key (the password protects it too)

    def _start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                self._jvm("kafka.Kafka", str(self.props), heap="768m"),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI that started it; stopped by pid
                cwd=self.root,
                env={**os.environ, "KAFKA_HEAP_OPTS": "", KEYSTORE_PASSWORD_ENV: env[KEYSTORE_PASSWORD_ENV]},
            )
        write_pid(self.pid_file, proc.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        bootstrap = self.profile.kafka_bootstrap
        last = "no answer"
        pid = read_pid(self.pid_file)
        while time.monotonic() < deadline:
            # liveness by pid only: right after the fork the child may not have exec'd
            # java yet, so its command line does not show our marker
            if pid is None or not is_alive(pid):
                raise KafkaError(f"Kafka exited during startup on {bootstrap}; see {self.log}")
            if port_open("127.0.0.1", self.profile.kafka_port):
                try:
                    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
                    metadata = admin.list_topics(timeout=3)
                    if metadata.brokers:
                        return
                except Exception as exc:  # librdkafka raises KafkaException while the broker boots
                    last = str(exc)
            time.sleep(0.5)
        raise KafkaError(f"Kafka did not start on {bootstrap} within {timeout_s:.0f} s ({last}); see {self.log}")
