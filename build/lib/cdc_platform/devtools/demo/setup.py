"""Create the demo databases: the ``shop`` OLTP schema and pgbench's tables in ``bench``
(PostgreSQL, captured from the WAL), and the ``crm`` database in MariaDB (polled)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from importlib import resources

from psycopg import sql

from cdc_platform.devtools.demo.crm import setup_crm
from cdc_platform.devtools.stack.postgres import APP_ROLE, CAPTURE_ROLE, PASSWORD_ENVS, LocalPostgres, pgbench_path
from cdc_platform.devtools.stack.profiles import StackProfile

SHOP_TABLES = ("customers", "products", "orders", "order_lines", "payments", "audit_events")
PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def shop_schema_sql() -> str:
    return resources.files("cdc_platform.devtools.demo").joinpath("shop.sql").read_text()


def setup_demo(profile: StackProfile, pgbench_scale: int = 1, seed_customers: int = 200) -> Iterator[str]:
    from cdc_platform.devtools.demo.workload import seed_shop

    pg = LocalPostgres(profile)
    with pg.admin_connect("shop") as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(APP_ROLE)))
        conn.execute(shop_schema_sql().encode())
        conn.execute("RESET ROLE")
        _grant_select(conn, "public")
        # The publication must be created by the tables' owner: the capture role is
        # least-privilege (REPLICATION + SELECT) and may not.
        _ensure_publication(conn, "cdc_shop", SHOP_TABLES)
    yield "shop: schema ready (" + ", ".join(SHOP_TABLES) + "), publication cdc_shop"
    seeded = seed_shop(profile, customers=seed_customers)
    yield f"shop: seeded {seeded} customers" if seeded else "shop: already seeded"

    with pg.admin_connect("bench") as conn:
        exists = conn.execute("SELECT to_regclass('public.pgbench_accounts') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        _pgbench(profile, ["-i", "-q", "-s", str(pgbench_scale)])
        yield f"bench: pgbench -i -s {pgbench_scale} done"
    else:
        yield "bench: pgbench tables already there"
    with pg.admin_connect("bench") as conn:
        # pgbench_history has no primary key; capture needs whole old rows for it
        conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        _grant_select(conn, "public")
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(APP_ROLE)))
        # pgbench_history has no key and is not captured in the demo config
        _ensure_publication(conn, "cdc_bench", PGBENCH_TABLES[:3])
        conn.execute("RESET ROLE")
    yield setup_crm(profile)


def _ensure_publication(conn: object, name: str, tables: tuple[str, ...]) -> None:
    from psycopg import Connection

    assert isinstance(conn, Connection)
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone():
        return
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(sql.Identifier("public", t) for t in tables)
        )
    )


def _grant_select(conn: object, schema: str) -> None:
    """Least privilege for the platform: read the tables, nothing else."""
    from psycopg import Connection

    assert isinstance(conn, Connection)
    ident = sql.Identifier
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident(schema), ident(CAPTURE_ROLE)))
    conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(ident(schema), ident(CAPTURE_ROLE)))
    conn.execute(
        sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT SELECT ON TABLES TO {}").format(
            ident(APP_ROLE), ident(schema), ident(CAPTURE_ROLE)
        )
    )


def _pgbench(profile: StackProfile, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSWORD": os.environ[PASSWORD_ENVS[APP_ROLE]]}
    cmd = [pgbench_path(), "-h", "127.0.0.1", "-p", str(profile.pg_port), "-U", APP_ROLE, *args, "bench"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return result


def run_pgbench(profile: StackProfile, seconds: int, clients: int, rate: int = 0) -> int:
    args = ["-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)), "-n", "-P", "5"]
    if rate:
        args += ["-R", str(rate)]
    result = _pgbench(profile, args)
    print(result.stdout)
    return 0
