"""Polling throughput (rows/s into Kafka, acknowledged) against its floor: reading the same
rows with the same SELECT expressions and keyset pagination, without Kafka.

On the dev stack's MariaDB: a throwaway database with ``--rows`` rows in a table shaped
like the demo's ``crm.accounts`` (unsigned bigint, decimal, enum, json, datetime(6)),
all rows sharing few timestamps so the compound cursor does real work. The floor reads
every row through PyMySQL in ``--batch`` pages; the platform's poller (timestamp+incrementing)
publishes every row to Kafka and stores its cursor after each acknowledged batch.

Run: make bench   (or .venv/bin/python bench/bench_polling.py [--rows 200000 --batch 10000])
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from cdc_platform.config import PlatformConfig
from cdc_platform.devtools.stack import StackProfile, profile, stack_up
from cdc_platform.devtools.stack.mariadb import POLL_ROLE, LocalMariaDB
from cdc_platform.devtools.stack.stack import load_stack_env, stack_env
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.mysql.catalog import describe_mysql_table
from cdc_platform.sources.mysql.poller import PollingCapture

DDL = """CREATE TABLE accounts (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(120) NOT NULL,
  plan ENUM('free', 'pro', 'enterprise') NOT NULL,
  mrr DECIMAL(10,2) NOT NULL,
  external_ref BIGINT UNSIGNED NOT NULL,
  verified TINYINT(1) NOT NULL,
  profile JSON NULL,
  updated_at DATETIME(6) NOT NULL,
  KEY accounts_cursor (updated_at, id)
)"""
FILL = """INSERT INTO accounts (email, plan, mrr, external_ref, verified, profile, updated_at)
SELECT CONCAT('user', seq, '@example.com'), ELT(1 + seq % 3, 'free', 'pro', 'enterprise'), (seq % 500) * 1.25,
       18446744073709551615 - seq, seq % 2, CONCAT('{"locale": "en", "n": ', seq, '}'),
       TIMESTAMP('2026-01-01') + INTERVAL (seq DIV 1000) SECOND
FROM seq_1_to_{rows}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    prof = profile("dev")
    stack_up(prof)
    load_stack_env(prof)
    tag = uuid.uuid4().hex[:6]
    database = f"bench_poll_{tag}"
    admin = create_accounts(prof, database, args.rows)
    config = PlatformConfig.model_validate(
        {
            "sources": {
                "benchpoll": {
                    "kind": "jdbc",
                    "port": prof.mariadb_port,
                    "database": database,
                    "user": POLL_ROLE,
                    "password_env": "CDC_MARIADB_PASSWORD",
                    "topic_prefix": f"benchpoll{tag}",
                    "batch_size": args.batch,
                }
            },
            "kafka": {"bootstrap_servers": prof.kafka_bootstrap, "partitions": 3},
            "lake": {"root": "lake"},
            "tables": [
                {
                    "name": f"benchpoll.{database}.accounts",
                    "poll": {
                        "mode": "timestamp+incrementing",
                        "timestamp_column": "updated_at",
                        "incrementing_column": "id",
                    },
                }
            ],
        }
    )
    try:
        floor_s = _floor(config, database, args.batch)
        poller = open_source(config, "benchpoll").capture(CaptureSettings(until_caught_up=True, give_up_after_s=60))
        assert isinstance(poller, PollingCapture)
        started = time.monotonic()
        stats = poller.run()
        poll_s = time.monotonic() - started
        published = sum(stats.rows.values())
        assert published == args.rows, f"published {published} of {args.rows} rows"
        floor_rate, rate = args.rows / floor_s, args.rows / poll_s
        print(
            f"rows={args.rows} batch={args.batch}  floor (SELECT pages) {floor_s:6.2f} s ({floor_rate:9.0f} rows/s)  "
            f"poller into Kafka {poll_s:6.2f} s ({rate:8.0f} rows/s)  ratio poller/floor = {rate / floor_rate:.3f}"
        )
    finally:
        drop_database(admin, database)
        client = KafkaClients(config.kafka).admin()
        topics = [f"benchpoll{tag}.{database}.accounts", f"__cdc-offsets.benchpoll{tag}"]
        for future in client.delete_topics(topics, operation_timeout=30).values():
            try:
                future.result(timeout=30)
            except Exception as exc:  # a topic never created is fine here
                print(f"(cleanup: {exc})")


def create_accounts(prof: StackProfile, database: str, rows: int) -> Any:
    """A throwaway database holding ``accounts`` with ``rows`` rows, readable by the poll
    role. Returns the admin connection (``drop_database`` takes it)."""
    admin = LocalMariaDB(prof).admin_connect(stack_env(prof))
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}`")
        cur.execute(f"GRANT SELECT ON `{database}`.* TO '{POLL_ROLE}'@'127.0.0.1'")
        cur.execute(f"USE `{database}`")
        cur.execute(DDL)
        cur.execute(FILL.replace("{rows}", str(rows)))
    return admin


def drop_database(admin: Any, database: str) -> None:
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
    admin.close()


def _floor(config: PlatformConfig, database: str, batch: int) -> float:
    """Every row, the same expressions, the same keyset pages: what the database can hand out."""
    from cdc_platform.sources.mysql.connection import MysqlEndpoint

    source = config.sources["benchpoll"]
    conn = MysqlEndpoint("benchpoll", source, [], {}, "benchpoll", "").connect("bench")  # type: ignore[arg-type]
    try:
        _, mapped = describe_mysql_table(conn, database, "accounts")
        select = ", ".join(m.select_sql for m in mapped).replace("%", "%%")
        started = time.monotonic()
        last_ts, last_id, total = None, 0, 0
        with conn.cursor() as cur:
            while True:
                where, params = "", []
                if last_ts is not None:
                    where = "WHERE updated_at > %s OR (updated_at = %s AND id > %s)"
                    params = [last_ts, last_ts, last_id]
                cur.execute(
                    f"SELECT {select}, DATE_FORMAT(updated_at, '%%Y-%%m-%%d %%H:%%i:%%s.%%f'), id FROM accounts "
                    f"{where} ORDER BY updated_at, id LIMIT {batch}",
                    params,
                )
                rows = cur.fetchall()
                total += len(rows)
                if len(rows) < batch:
                    break
                last_ts, last_id = rows[-1][-2], rows[-1][-1]
        return time.monotonic() - started
    finally:
        conn.close()


if __name__ == "__main__":
    main()
