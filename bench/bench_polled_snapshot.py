"""A polled (MariaDB) table's snapshot generation against its floor: the same rows read with
the same SELECT expressions by MariaDB's own client, without Spark or Delta.

On the dev stack's MariaDB: a throwaway database with ``--rows`` rows in the table
``bench_polling.py`` fills (shaped like the demo's ``crm.accounts``: an unsigned int
primary key, decimal, enum, json, unsigned bigint, datetime(6)). The floor is one
``SELECT`` of every row, each column through the mapping's expression (what the snapshot
reads), by the ``mariadb`` command-line client into /dev/null: MariaDB's analog of
PostgreSQL's ``COPY … TO STDOUT``, one connection, the server serializing every row and a
C client reading it. Then ``--repeat``
generations of the table (``Lake.snapshot``: key-range chunks read by Spark JDBC tasks,
written as Delta, validated, committed), after one warm-up generation that is not counted.
The table's primary key vouches for each chunk, so validation reads the Delta log's file
statistics instead of the rows (``lake/key_proof.py``).

Run: .venv/bin/python bench/bench_polled_snapshot.py [--rows 2000000 --repeat 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
import uuid

from bench_polling import create_accounts, drop_database

from cdc_platform.config import PlatformConfig
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile, stack_up
from cdc_platform.devtools.stack.mariadb import POLL_ROLE
from cdc_platform.devtools.stack.profiles import REPO_ROOT
from cdc_platform.devtools.stack.stack import load_stack_env
from cdc_platform.lake.session import get_spark_session
from cdc_platform.sources.mysql.catalog import describe_mysql_table
from cdc_platform.sources.mysql.connection import MysqlEndpoint


def bench_config(database: str, port: int, bootstrap: str, root: str) -> PlatformConfig:
    return PlatformConfig.model_validate(
        {
            "sources": {
                "benchpoll": {  # the name bench_polling's floor reads from
                    "kind": "jdbc",
                    "port": port,
                    "database": database,
                    "user": POLL_ROLE,
                    "password_env": "CDC_MARIADB_PASSWORD",
                    "topic_prefix": f"benchgen_{database}",
                }
            },
            "kafka": {"bootstrap_servers": bootstrap},
            "lake": {"root": root},
            "spark": {"master": "local[*]", "jars_dir": str(REPO_ROOT / ".cdc" / "jars" / "spark")},
            "tables": [
                {
                    "name": f"benchpoll.{database}.accounts",
                    "poll": {"mode": "timestamp+incrementing", "timestamp_column": "updated_at",
                             "incrementing_column": "id"},
                }
            ],
        }
    )  # fmt: skip


def client_floor(config: PlatformConfig, database: str) -> float:
    """Every row through the mapping's expressions, read by the ``mariadb`` client (its
    password in ``MYSQL_PWD``, never on the command line)."""
    source = config.sources["benchpoll"]
    conn = MysqlEndpoint("benchpoll", source, [], {}, "benchpoll", "").connect("bench")  # type: ignore[arg-type]
    try:
        _, mapped = describe_mysql_table(conn, database, "accounts")
    finally:
        conn.close()
    select = f"SELECT {', '.join(m.select_sql for m in mapped)} FROM `{database}`.accounts"
    command = ["mariadb", "--protocol=TCP", "-h", "127.0.0.1", "-P", str(source.port), "-u", POLL_ROLE,
               "--quick", "--batch", "--skip-column-names", "-e", select]  # fmt: skip
    environment = {**os.environ, "MYSQL_PWD": os.environ["CDC_MARIADB_PASSWORD"]}
    started = time.monotonic()
    subprocess.run(command, env=environment, stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    prof = profile("dev")
    stack_up(prof)
    load_stack_env(prof)
    database = f"bench_gen_{uuid.uuid4().hex[:6]}"
    admin = create_accounts(prof, database, args.rows)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_polled_snapshot_") as root:
            config = bench_config(database, prof.mariadb_port, prof.kafka_bootstrap, root)
            floor_s = client_floor(config, database)
            lake = Lake(config, get_spark_session(config.spark))
            key = config.tables[0].key
            lake.snapshot(key, "warmup")
            for n in range(args.repeat):
                started = time.monotonic()
                result = lake.snapshot(key, f"g{n}")
                took = time.monotonic() - started
                assert result.rows == args.rows, f"the generation holds {result.rows} of {args.rows} rows"
                print(
                    f"rows={args.rows}  floor (mariadb client) {floor_s:6.2f} s ({args.rows / floor_s:9.0f} rows/s)  "
                    f"generation {took:6.2f} s ({args.rows / took:8.0f} rows/s)  ratio generation/floor = "
                    f"{floor_s / took:.3f}"
                )
    finally:
        drop_database(admin, database)


if __name__ == "__main__":
    main()
