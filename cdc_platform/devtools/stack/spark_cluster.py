"""A Spark standalone cluster, one master and one worker, from the jars pyspark ships: the
cluster a config's ``spark.master: spark://…`` names, so that the platform's Spark work
(snapshot chunks read over JDBC in tasks, the Kafka source, the Python decoder, Delta
writes) is tested on executors of their own, not only in a local driver.

Loopback only (``SPARK_LOCAL_IP``: the master, the worker, their web UIs and the
executors listen on 127.0.0.1), started and stopped by pid like Kafka; started on demand
(``spark/test_cluster.py``), stopped by ``cdc-platform dev down``. The master's web UI
answers ``/json/`` with its workers and applications.
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
from cdc_platform.devtools.stack.procs import is_alive, port_open, read_pid, recorded_process, terminate, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# one executor of Spark's default 1 GB heap and its overhead, on every core the machine has
WORKER_MEMORY = "2g"


class SparkClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    """pyspark's package directory: its ``jars/`` hold the master, the worker and what an
    executor runs; the worker starts executors from it."""
    import pyspark

    return Path(pyspark.__file__).parent


class LocalSparkCluster:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "spark"
        port = profile.spark_master_port
        self.master_port, self.master_ui_port = port, port + 1
        self.worker_port, self.worker_ui_port = port + 2, port + 3
        self.master_url = profile.spark_master_url
        self.web_url = f"http://127.0.0.1:{self.master_ui_port}"
        self.pid_files = {"master": profile.pids / "spark-master.pid", "worker": profile.pids / "spark-worker.pid"}
        self.logs = {"master": profile.logs / "spark-master.log", "worker": profile.logs / "spark-worker.log"}

    def running_pids(self) -> dict[str, int]:
        """The master's and the worker's pids, of those running (the pid file's process, if
        its command line is that daemon's)."""
        found = {}
        for role, daemon in (("master", MASTER_CLASS), ("worker", WORKER_CLASS)):
            pid = recorded_process(self.pid_files[role], f"{daemon} --host 127.0.0.1 --port {self._port(role)} ")
            if pid is not None:
                found[role] = pid
        return found

    def up(self, timeout_s: float = 120.0) -> bool:
        """Start the master and the worker if they are not running, then wait until the
        master lists the worker alive. Returns True if this call started either."""
        running = self.running_pids()
        started = False
        for role, args in (("master", self._master_args()), ("worker", self._worker_args())):
            if role in running:
                continue
            for port in (self._port(role), self._ui_port(role)):
                if port_open("127.0.0.1", port):
                    raise SparkClusterError(
                        f"port 127.0.0.1:{port} (Spark {role}) is taken by a process this stack did not start; "
                        "stop it, or run this profile elsewhere"
                    )
            self._start(role, args)
            started = True
        self._wait_ready(timeout_s)
        return started

    def down(self) -> bool:
        """Stop the worker (and with it its executors), then the master: only what this stack started."""
        running = self.running_pids()
        for role in ("worker", "master"):
            if role in running:
                terminate(running[role], timeout_s=30)
                self.pid_files[role].unlink(missing_ok=True)
        return bool(running)

    def state(self) -> dict[str, Any]:
        """The master's own account (``/json/``): ``workers``, ``activeapps``, ``completedapps``."""
        try:
            with urllib.request.urlopen(self.web_url + "/json/", timeout=10) as response:  # noqa: S310 (http, loopback)
                return dict(json.loads(response.read()))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise SparkClusterError(f"the Spark master's web UI {self.web_url} did not answer: {exc}") from None

    def executor_logs(self, app_id: str) -> list[str]:
        """What each executor of application ``app_id`` wrote (its stderr, Spark's log)."""
        return [p.read_text(errors="replace") for p in sorted((self.root / "work" / app_id).glob("*/stderr"))]

    def _port(self, role: str) -> int:
        return self.master_port if role == "master" else self.worker_port

    def _ui_port(self, role: str) -> int:
        return self.master_ui_port if role == "master" else self.worker_ui_port

    def _master_args(self) -> list[str]:
        return [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port),
                "--webui-port", str(self.master_ui_port)]  # fmt: skip

    def _worker_args(self) -> list[str]:
        return [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(self.worker_port),
                "--webui-port", str(self.worker_ui_port), "--cores", str(os.cpu_count() or 1),
                "--memory", WORKER_MEMORY, "--work-dir", str(self.root / "work"), self.master_url]  # fmt: skip

    def _start(self, role: str, args: list[str]) -> None:
        home = spark_home()
        if not any((home / "jars").glob("spark-core_*.jar")):
            raise SparkClusterError(f"Spark's jars not found in {home / 'jars'}; run scripts/bootstrap.sh (pyspark)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs[role].parent.mkdir(parents=True, exist_ok=True)
        command = [_java(), "-Xmx256m", "-cp", f"{home / 'jars'}/*", *args]
        environment = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",  # the daemons, their web UIs and the executors
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            # the worker's launcher asks for it before it builds an executor's classpath, and
            # without it looks for a source build ("Cannot find any build directories")
            "SPARK_SCALA_VERSION": "2.13",
        }
        with self.logs[role].open("ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root, env=environment,
            )  # fmt: skip
        write_pid(self.pid_files[role], proc.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            for role, pid_file in self.pid_files.items():
                pid = read_pid(pid_file)
                if pid is None or not is_alive(pid):
                    raise SparkClusterError(f"the Spark {role} exited during startup; see {self.logs[role]}")
            try:
                workers = self.state().get("workers", [])
                if any(w.get("state") == "ALIVE" for w in workers):
                    return
                last = f"workers: {[w.get('state') for w in workers]}"
            except SparkClusterError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise SparkClusterError(f"no Spark worker alive on {self.master_url} within {timeout_s:.0f} s ({last})")
