"""A PostgreSQL cluster from Debian's packages, run from ``.cdc/<profile>/pg``.

``wal_level=logical``, listening on 127.0.0.1 only. Administration goes through the
cluster's private unix socket (trust, local only); applications use TCP with scram
passwords that are generated once and kept in ``.cdc/<profile>/env``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

from cdc_platform.devtools.stack.procs import port_open, recorded_process, write_pid
from cdc_platform.devtools.stack.profiles import StackProfile

ADMIN_USER = "cdc_admin"
# The platform's least-privilege role: LOGIN REPLICATION, SELECT on captured tables.
CAPTURE_ROLE = "cdc_capture"
# The demo application's role: owns the demo schema and runs the workload.
APP_ROLE = "shop_app"
# Dagster's own storage (runs, event log, schedules) for the demo's instance (dagster.yaml):
# PostgreSQL, as in production, not SQLite: several processes write at once (daemon, runs,
# the apply's reports, the webserver), and the webserver holds pooled connections where
# SQLite's storage builds an engine per query (its CPU for the same pages -39 %, though the
# busy demo's page times did not change beyond noise: docs/benchmarks.md, "UI load").
DAGSTER_ROLE = "dagster"
DATABASES = ("shop", "bench")
PASSWORD_ENVS = {
    CAPTURE_ROLE: "CDC_PG_PASSWORD",
    APP_ROLE: "SHOP_APP_PASSWORD",
    DAGSTER_ROLE: "CDC_DAGSTER_PG_PASSWORD",
}


class PostgresError(RuntimeError):
    pass


def bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_version_key)
    if not candidates:
        raise PostgresError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; "
            "run scripts/bootstrap.sh (it apt-get installs postgresql)"
        )
    return Path(candidates[-1]).parent


def _version_key(path: str) -> int:
    try:
        return int(Path(path).parts[4])
    except (IndexError, ValueError):
        return 0


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root; as root we run it as the Debian 'postgres' user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresError(
            "running as root but there is no 'postgres' system user to run the server as; "
            "apt-get install postgresql creates it"
        ) from None
    return "postgres"


def _as_server_user(cmd: Sequence[str]) -> list[str]:
    user = _server_user()
    return ["runuser", "-u", user, "--", *cmd] if user else list(cmd)


def _chown_for_server(path: Path) -> None:
    user = _server_user()
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


class LocalPostgres:
    def __init__(self, profile: StackProfile) -> None:
        self.profile = profile
        self.root = profile.root / "pg"
        self.data = self.root / "data"
        self.socket_dir = self.root / "run"
        self.log = profile.logs / "postgres.log"
        self.pid_file = profile.pids / "postgres.pid"

    # -- lifecycle --------------------------------------------------------------------
    def running_pid(self) -> int | None:
        return recorded_process(self.pid_file, str(self.data))

    def up(self, passwords: dict[str, str]) -> bool:
        """Start the cluster (initialising it on first use). Returns True if we started it."""
        started = False
        if self.running_pid() is None:
            if port_open("127.0.0.1", self.profile.pg_port):
                raise PostgresError(
                    f"port 127.0.0.1:{self.profile.pg_port} is taken by a process this stack did not start; "
                    f"stop it, or run the '{self.profile.name}' profile elsewhere"
                )
            if not (self.data / "PG_VERSION").exists():
                self._initdb()
            self._write_conf()
            self._start()
            started = True
        self._wait_ready()
        self._provision(passwords)
        return started

    def down(self) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        subprocess.run(
            _as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
            check=False,
            capture_output=True,
        )
        self.pid_file.unlink(missing_ok=True)
        return True

    def _initdb(self) -> None:
        for path in (self.root, self.data, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
            _chown_for_server(path)
        self.data.chmod(0o700)
        result = subprocess.run(
            _as_server_user(
                [
                    str(bin_dir() / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    ADMIN_USER,
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise PostgresError(f"initdb failed for {self.data}:\n{result.stderr[-2000:]}")

    def _write_conf(self) -> None:
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.profile.pg_port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            # a slot that falls this far behind is invalidated (wal_status=lost) instead of
            # filling the disk: the platform detects that and rehydrates the table
            "max_slot_wal_keep_size": "'4GB'",
            "fsync": "on" if self.profile.pg_fsync else "off",
            # synchronous_commit stays on: logical decoding reads only flushed WAL, so an
            # unflushed commit would be invisible to capture for up to wal_writer_delay
            "full_page_writes": "on" if self.profile.pg_fsync else "off",
            "shared_buffers": "'256MB'",
            "max_connections": "200",
            "log_min_messages": "warning",
            "password_encryption": "'scram-sha-256'",
        }
        body = "".join(f"{k} = {v}\n" for k, v in conf.items())
        (self.data / "cdc_platform.conf").write_text(body)
        main = self.data / "postgresql.conf"
        text = main.read_text()
        include = "include_if_exists = 'cdc_platform.conf'\n"
        if include not in text:
            main.write_text(text + "\n" + include)

    def _start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        _chown_for_server(self.socket_dir)
        if not self.log.exists():
            self.log.touch()
        _chown_for_server(self.log)
        result = subprocess.run(
            _as_server_user(
                [
                    str(bin_dir() / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise PostgresError(
                f"PostgreSQL did not start on 127.0.0.1:{self.profile.pg_port} within 60 s; "
                f"see {self.log}\n{result.stdout[-1000:]}{result.stderr[-1000:]}"
            )
        pid_line = (self.data / "postmaster.pid").read_text().splitlines()[0]
        write_pid(self.pid_file, int(pid_line))

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with self.admin_connect("postgres") as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.3)
        raise PostgresError(
            f"PostgreSQL on 127.0.0.1:{self.profile.pg_port} did not accept connections within "
            f"{timeout_s:.0f} s ({last}); see {self.log}"
        )

    # -- access ---------------------------------------------------------------------
    def admin_connect(self, dbname: str, autocommit: bool = True) -> psycopg.Connection[tuple[object, ...]]:
        """Superuser connection over the cluster's private unix socket (local trust)."""
        return psycopg.connect(
            host=str(self.socket_dir),
            port=self.profile.pg_port,
            user=ADMIN_USER,
            dbname=dbname,
            autocommit=autocommit,
            connect_timeout=5,
        )

    def _provision(self, passwords: dict[str, str]) -> None:
        """Roles and databases, idempotently; passwords re-applied from the env file."""
        with self.admin_connect("postgres") as conn:
            for role, attrs in ((CAPTURE_ROLE, "LOGIN REPLICATION"), (APP_ROLE, "LOGIN"), (DAGSTER_ROLE, "LOGIN")):
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                verb = "ALTER" if exists else "CREATE"
                conn.execute(
                    sql.SQL("{} ROLE {} " + attrs + " PASSWORD {}").format(
                        sql.SQL(verb), sql.Identifier(role), sql.Literal(passwords[PASSWORD_ENVS[role]])
                    )
                )
            for db in DATABASES:
                _create_database(conn, db, APP_ROLE)
                conn.execute(
                    sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                        sql.Identifier(db), sql.Identifier(CAPTURE_ROLE)
                    )
                )
            _create_database(conn, DAGSTER_ROLE, DAGSTER_ROLE)

    def info(self) -> dict[str, str]:
        with self.admin_connect("postgres") as conn:
            row = conn.execute("SELECT current_setting('server_version'), current_setting('wal_level')").fetchone()
        assert row is not None
        return {"version": str(row[0]), "wal_level": str(row[1])}


def _create_database(conn: psycopg.Connection[tuple[object, ...]], name: str, owner: str) -> None:
    """``name``, owned by ``owner``, unless it exists."""
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner)))


def pgbench_path() -> str:
    path = bin_dir() / "pgbench"
    if path.exists():
        return str(path)
    found = shutil.which("pgbench")
    if not found:
        raise PostgresError("pgbench not found; apt-get install postgresql-contrib")
    return found
