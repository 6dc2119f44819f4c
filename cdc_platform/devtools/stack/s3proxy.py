"""An S3-compatible object store for the stack: S3Proxy (gaul/s3proxy, from Maven Central)
over a local directory, so that a lake on ``s3a://`` is tested against a real S3 server
(signatures, listings, conditional puts) with Spark's S3A and delta-rs as its clients.

Loopback only, started and stopped by pid like Kafka; started on demand (the tests'
``s3_store`` fixture), stopped by ``cdc-platform dev down``. Its key pair is the stack's
generated secret (``CDC_S3_ACCESS_KEY_ID`` / ``CDC_S3_SECRET_ACCESS_KEY`` in
``.cdc/<profile>/env``), written to its properties file with mode 0600. A bucket is a
directory under ``s3/data``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from cdc_platform.devtools.stack.kafka import _java
from cdc_platform.devtools.stack.procs import is_alive, port_open, read_pid, recorded_process, stop_recorded, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile, state_root

MAIN_CLASS = "org.gaul.s3proxy.Main"
ACCESS_KEY_ID_ENV = "CDC_S3_ACCESS_KEY_ID"
SECRET_ACCESS_KEY_ENV = "CDC_S3_SECRET_ACCESS_KEY"  # noqa: S105 (a variable name)
REGION = "us-east-1"
# S3Proxy logs through logback, at DEBUG without a configuration of its own (every request
# and Jetty's internals: a demo's lake wrote gigabytes); INFO keeps starts and failures
LOGBACK = """<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="out"/></root>
</configuration>
"""


class S3StoreError(RuntimeError):
    pass


def jars_dir() -> Path:
    return state_root() / "jars" / "s3proxy"


class LocalS3Store:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "s3"
        self.data = self.root / "data"
        self.port = profile.s3_port
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.pid_file = profile.pids / "s3proxy.pid"
        self.log = profile.logs / "s3proxy.log"

    def running_pid(self) -> int | None:
        return recorded_process(self.pid_file, f"{MAIN_CLASS} --properties {self.root / 's3proxy.properties'}")

    def up(self, env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> bool:
        """Start the store unless it runs; True if this call started it. Its key pair comes
        from ``env`` (the stack's secrets), else from this process's environment."""
        if self.running_pid() is not None:
            return False
        if port_open("127.0.0.1", self.port):
            raise S3StoreError(
                f"port 127.0.0.1:{self.port} (S3 store) is taken by a process this stack did not start; "
                "stop it, or run this profile elsewhere"
            )
        if not any(jars_dir().glob("s3proxy-*.jar")):
            raise S3StoreError(f"S3Proxy's jars not found in {jars_dir()}; run scripts/bootstrap.sh (it resolves them)")
        self._write_config(os.environ if env is None else env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        properties = str(self.root / "s3proxy.properties")
        command = [_java(), "-Xmx256m", f"-Dlogback.configurationFile={self.root / 'logback.xml'}",
                   "-cp", f"{jars_dir()}/*", MAIN_CLASS, "--properties", properties]  # fmt: skip
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root,
            )  # fmt: skip
        write_pid(self.pid_file, proc.pid)
        self._wait_ready(timeout_s)
        return True

    def down(self) -> bool:
        return stop_recorded(self.running_pid(), self.pid_file)

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (a directory of the store) if missing; its ``s3a://`` URI."""
        (self.data / name).mkdir(parents=True, exist_ok=True)
        return f"s3a://{name}"

    def _write_config(self, env: Mapping[str, str]) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        (self.root / "logback.xml").write_text(LOGBACK)
        properties = "\n".join([
            f"s3proxy.endpoint=http://127.0.0.1:{self.port}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={env[ACCESS_KEY_ID_ENV]}",
            f"s3proxy.credential={env[SECRET_ACCESS_KEY_ENV]}",
            # (S3Proxy 3.0's filesystem-nio2 answered a directory marker's key without its
            # slash as a file, and S3A then refused Delta's _delta_log/_staged_commits/)
            "jclouds.provider=filesystem-nio2",
            f"jclouds.filesystem.basedir={self.data}",
        ])  # fmt: skip
        path = self.root / "s3proxy.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(properties + "\n")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = read_pid(self.pid_file)
            if pid is None or not is_alive(pid):
                raise S3StoreError(f"S3Proxy exited during startup; see {self.log}")
            if port_open("127.0.0.1", self.port):
                return
            time.sleep(0.3)
        raise S3StoreError(f"S3Proxy did not listen on 127.0.0.1:{self.port} within {timeout_s:.0f} s; see {self.log}")
