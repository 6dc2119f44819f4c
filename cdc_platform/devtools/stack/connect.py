"""A standalone Kafka Connect worker with the Debezium PostgreSQL connector, from the
Maven Central jars scripts/bootstrap.sh resolved into ``.cdc/jars/connect`` and
``.cdc/jars/debezium``: the external producer the lake is tested against.

Loopback only (REST on 127.0.0.1), started and stopped by pid like Kafka. Connectors are
created and removed through its REST API (``ConnectRest``). Secrets never enter a file:
connector configs name them as ``${env:NAME}`` and the worker's ``EnvVarConfigProvider``
resolves them from its environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cdc_platform.devtools.stack.kafka import _java
from cdc_platform.devtools.stack.procs import is_alive, port_open, read_pid, recorded_process, stop_recorded, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile, state_root

DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"
LOG4J2_PROPERTIES = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


class ConnectError(RuntimeError):
    pass


def _classpath() -> str:
    jars = state_root() / "jars"
    for name, probe in (("connect", "connect-runtime-*.jar"), ("debezium", "debezium-connector-postgres-*.jar")):
        if not any((jars / name).glob(probe)):
            raise ConnectError(f"{name} jars not found in {jars / name}; run scripts/bootstrap.sh (it resolves them)")
    # Debezium on the worker's classpath: the pom excludes what the worker provides
    return f"{jars / 'connect'}/*:{jars / 'debezium'}/*"


class ConnectRest:
    """The worker's REST API (connectors and their status)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        if not self.url.startswith(("http://", "https://")):
            raise ConnectError(f"Kafka Connect URL {self.url!r} is not http(s)")
        request = urllib.request.Request(  # noqa: S310 (http(s) checked above)
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise ConnectError(f"Kafka Connect {method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def put_connector(self, name: str, config: dict[str, str]) -> None:
        self.call("PUT", f"/connectors/{name}/config", config)

    def delete_connector(self, name: str) -> None:
        try:
            self.call("DELETE", f"/connectors/{name}")
        except ConnectError as exc:
            if "HTTP 404" not in str(exc):
                raise

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/connectors/{name}/status"))

    def wait_running(self, name: str, timeout_s: float = 60.0) -> None:
        """Until the connector and its task run; a FAILED task raises with its trace."""
        deadline = time.monotonic() + timeout_s
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                state = self.status(name)
            except ConnectError:
                time.sleep(0.5)
                continue
            tasks = state.get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed or state.get("connector", {}).get("state") == "FAILED":
                trace = (failed[0] if failed else state["connector"]).get("trace", "")
                raise ConnectError(f"connector {name} failed: {trace[:3000]}")
            if state.get("connector", {}).get("state") == "RUNNING" and tasks and tasks[0].get("state") == "RUNNING":
                return
            time.sleep(0.5)
        raise ConnectError(f"connector {name} not running within {timeout_s:.0f} s: {state}")


class LocalConnect:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "connect"
        self.props = self.root / "worker.properties"
        self.log4j = self.root / "log4j2.properties"
        self.log = profile.logs / "connect.log"
        self.pid_file = profile.pids / "connect.pid"
        self.rest = ConnectRest(profile.connect_url)

    def running_pid(self) -> int | None:
        return recorded_process(self.pid_file, str(self.props))

    def up(self, timeout_s: float = 120.0) -> bool:
        """Start the worker if it is not running. Returns True if we started it."""
        started = False
        if self.running_pid() is None:
            if port_open("127.0.0.1", self.profile.connect_port):
                raise ConnectError(
                    f"port 127.0.0.1:{self.profile.connect_port} is taken by a process this stack did not start; "
                    "stop it, or run this profile elsewhere"
                )
            self.root.mkdir(parents=True, exist_ok=True)
            self._write_config()
            self._start()
            started = True
        self._wait_ready(timeout_s)
        return started

    def down(self) -> bool:
        return stop_recorded(self.running_pid(), self.pid_file)

    def _write_config(self) -> None:
        props = {
            "bootstrap.servers": self.profile.kafka_bootstrap,
            "listeners": f"http://127.0.0.1:{self.profile.connect_port}",
            "rest.advertised.host.name": "127.0.0.1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.root / "offsets"),
            "offset.flush.interval.ms": "1000",
            "config.providers": "env",
            "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
            "plugin.discovery": "service_load",
        }
        self.props.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log4j.write_text(LOG4J2_PROPERTIES)

    def _start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            _java(), "-Xmx384m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j}", "-cp", _classpath(),
            "org.apache.kafka.connect.cli.ConnectStandalone", str(self.props),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root, env=dict(os.environ),
            )  # fmt: skip
        write_pid(self.pid_file, proc.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pid = read_pid(self.pid_file)
        last = "no answer"
        while time.monotonic() < deadline:
            if pid is None or not is_alive(pid):
                raise ConnectError(f"Kafka Connect exited during startup; see {self.log}")
            try:
                plugins = self.rest.call("GET", "/connector-plugins")
                if any(p.get("class") == DEBEZIUM_POSTGRES for p in plugins):
                    return
                last = f"plugins without Debezium: {[p.get('class') for p in plugins]}"
            except (ConnectError, OSError) as exc:
                last = str(exc)
            time.sleep(0.5)
        raise ConnectError(
            f"Kafka Connect not ready on {self.rest.url} within {timeout_s:.0f} s ({last}); see {self.log}"
        )


def connect_log(profile: StackProfile) -> Path:
    return profile.logs / "connect.log"
