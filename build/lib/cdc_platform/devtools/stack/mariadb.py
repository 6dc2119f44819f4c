"""A MariaDB server from Debian's packages, run from ``.cdc/<profile>/mariadb``.

The polling (query-based) source's database in the local stack: listening on 127.0.0.1
only, binary log off (the point of this source is that it needs no replication feed).
Administration uses ``root`` over the server's private unix socket with a generated
password; applications use TCP with their own generated passwords, all kept in
``.cdc/<profile>/env`` (mode 0600).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pymysql

from cdc_platform.devtools.stack.procs import port_open, recorded_process, terminate, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile

# the platform's polling role: SELECT on the captured database, nothing else
POLL_ROLE = "cdc_poll"
# the demo application's role: owns the demo database and runs its workload
CRM_APP_ROLE = "crm_app"
DATABASES = ("crm",)
MARIADB_PASSWORD_ENVS = {
    "root": "CDC_MARIADB_ROOT_PASSWORD",
    POLL_ROLE: "CDC_MARIADB_PASSWORD",
    CRM_APP_ROLE: "CRM_APP_PASSWORD",
}


class MariaDBError(RuntimeError):
    pass


def server_binary() -> str:
    found = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise MariaDBError("mariadbd not found; run scripts/bootstrap.sh (it apt-get installs mariadb-server)")
    return found


def _install_db_binary() -> str:
    found = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if not found:
        raise MariaDBError("mariadb-install-db not found; apt-get install mariadb-server")
    return found


def _server_user() -> str | None:
    """mariadbd will not run as root unless told to; as root it runs as Debian's 'mysql' user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("mysql")
    except KeyError:
        raise MariaDBError(
            "running as root but there is no 'mysql' system user; apt-get install mariadb-server"
        ) from None
    return "mysql"


def _chown_for_server(path: Path) -> None:
    user = _server_user()
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


class LocalMariaDB:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "mariadb"
        self.data = self.root / "data"
        self.socket = self.root / "run" / "mariadb.sock"
        self.cnf = self.root / "my.cnf"
        self.log = profile.logs / "mariadb.log"
        self.pid_file = profile.pids / "mariadb.pid"

    def running_pid(self) -> int | None:
        return recorded_process(self.pid_file, str(self.cnf))

    def up(self, passwords: dict[str, str]) -> bool:
        """Start the server (initialising the data directory on first use); True if we started it."""
        started: subprocess.Popen[bytes] | None = None
        if self.running_pid() is None:
            if port_open("127.0.0.1", self.profile.mariadb_port):
                raise MariaDBError(
                    f"port 127.0.0.1:{self.profile.mariadb_port} is taken by a process this stack did not start; "
                    f"stop it, or run the '{self.profile.name}' profile elsewhere"
                )
            self._write_cnf()
            fresh = not (self.data / "mysql").exists()
            if fresh:
                self._install_db()
            started = self._start()
        self._wait_ready(passwords, started)
        self._provision(passwords)
        return started is not None

    def down(self) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        terminate(pid, timeout_s=60)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _write_cnf(self) -> None:
        for path in (self.root, self.data, self.socket.parent):
            path.mkdir(parents=True, exist_ok=True)
            _chown_for_server(path)
        durable = self.profile.pg_fsync  # the test profile trades durability for speed, as PostgreSQL does
        settings = {
            "datadir": str(self.data),
            "socket": str(self.socket),
            "port": str(self.profile.mariadb_port),
            "bind-address": "127.0.0.1",
            "skip-name-resolve": "1",
            "character-set-server": "utf8mb4",
            "collation-server": "utf8mb4_unicode_ci",
            "innodb_buffer_pool_size": "128M",
            "innodb_flush_log_at_trx_commit": "1" if durable else "2",
            "max_connections": "200",
            "log-error": str(self.log),
            "pid-file": str(self.root / "run" / "mariadbd.pid"),
        }
        user = _server_user()
        if user:
            settings["user"] = user
        body = "[mariadbd]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items())
        self.cnf.write_text(body)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.touch(exist_ok=True)
        _chown_for_server(self.log)

    def _install_db(self) -> None:
        cmd = [
            _install_db_binary(),
            f"--defaults-file={self.cnf}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise MariaDBError(f"mariadb-install-db failed for {self.data}:\n{result.stderr[-2000:]}")

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                [server_binary(), f"--defaults-file={self.cnf}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # not killed with the shell that ran `dev up`
            )
        write_pid(self.pid_file, proc.pid)
        return proc

    def _wait_ready(
        self, passwords: dict[str, str], started: subprocess.Popen[bytes] | None, timeout_s: float = 60.0
    ) -> None:
        """Until root can connect. A server we just started is watched through its process
        handle (its exit code is then in the message), one already running through its pid file."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            code = started.poll() if started is not None else None
            if code is not None or (started is None and self.running_pid() is None):
                raise MariaDBError(f"MariaDB exited during start (exit code {code}); see {self.log}")
            try:
                with self.admin_connect(passwords):
                    return
            except pymysql.err.OperationalError as exc:
                last = exc
                time.sleep(0.3)
        raise MariaDBError(
            f"MariaDB on 127.0.0.1:{self.profile.mariadb_port} did not accept connections within "
            f"{timeout_s:.0f} s ({last}); see {self.log}"
        )

    def admin_connect(self, passwords: dict[str, str]) -> pymysql.connections.Connection[Any]:
        """root over the private unix socket. A fresh data directory's root has no password
        yet; provisioning sets the generated one, so both are tried."""
        password = passwords[MARIADB_PASSWORD_ENVS["root"]]
        try:
            return pymysql.connect(unix_socket=str(self.socket), user="root", password=password, autocommit=True)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == 1045:  # access denied: not provisioned yet
                return pymysql.connect(unix_socket=str(self.socket), user="root", password="", autocommit=True)
            raise

    def _provision(self, passwords: dict[str, str]) -> None:
        """Roles, databases and grants, idempotently; passwords re-applied from the env file."""
        with self.admin_connect(passwords) as conn, conn.cursor() as cur:
            for db in DATABASES:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4")
            for role in (POLL_ROLE, CRM_APP_ROLE):
                secret = passwords[MARIADB_PASSWORD_ENVS[role]]
                for host in ("127.0.0.1", "localhost"):
                    cur.execute(f"CREATE USER IF NOT EXISTS '{role}'@'{host}' IDENTIFIED BY %s", (secret,))
                    cur.execute(f"ALTER USER '{role}'@'{host}' IDENTIFIED BY %s", (secret,))
                    for db in DATABASES:
                        grant = "SELECT" if role == POLL_ROLE else "ALL PRIVILEGES"
                        cur.execute(f"GRANT {grant} ON `{db}`.* TO '{role}'@'{host}'")
            cur.execute("ALTER USER 'root'@'localhost' IDENTIFIED BY %s", (passwords[MARIADB_PASSWORD_ENVS["root"]],))

    def info(self, passwords: dict[str, str]) -> dict[str, str]:
        with self.admin_connect(passwords) as conn, conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            row = cur.fetchone()
        return {"version": str(row[0]) if row else "?"}
