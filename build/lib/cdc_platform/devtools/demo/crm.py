"""The demo's polled source: a small CRM in MariaDB (``crm.accounts``), and its workload.

The table has what query-based capture needs: an AUTO_INCREMENT id, an ``updated_at`` set
on every write (the timestamp+incrementing cursor), and a ``deleted_at`` soft-delete
column. The workload also hard-deletes now and then, which polling cannot see — the
completeness check warns about those rows and the hourly reconciliation drops them."""

from __future__ import annotations

import json
import os
import random
import uuid
from typing import Any

import pymysql

from cdc_platform.devtools.stack.mariadb import CRM_APP_ROLE, MARIADB_PASSWORD_ENVS
from cdc_platform.devtools.stack.profiles import StackProfile

ACCOUNTS_DDL = """CREATE TABLE IF NOT EXISTS accounts (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(120) NOT NULL UNIQUE,
  plan ENUM('free', 'pro', 'enterprise') NOT NULL DEFAULT 'free',
  seats SMALLINT UNSIGNED NOT NULL DEFAULT 1,
  mrr DECIMAL(10,2) NOT NULL DEFAULT 0,
  external_ref BIGINT UNSIGNED NULL,
  verified TINYINT(1) NOT NULL DEFAULT 0,
  profile JSON NULL,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  deleted_at DATETIME(6) NULL,
  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  KEY accounts_cursor (updated_at, id)
)"""
PLANS = {"free": 0, "pro": 29, "enterprise": 499}


def crm_connect(profile: StackProfile) -> Any:
    """The demo application's own connection (TCP, its generated password)."""
    return pymysql.connect(
        host="127.0.0.1",
        port=profile.mariadb_port,
        user=CRM_APP_ROLE,
        password=os.environ[MARIADB_PASSWORD_ENVS[CRM_APP_ROLE]],
        database="crm",
        autocommit=True,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
    )


def setup_crm(profile: StackProfile, seed_accounts: int = 100) -> str:
    with crm_connect(profile) as conn, conn.cursor() as cur:
        cur.execute(ACCOUNTS_DDL)
        cur.execute("SELECT COUNT(*) FROM accounts")
        row = cur.fetchone()
        if row and int(row[0]):
            return "crm: accounts already seeded"
        workload = CrmWorkload(cur, random.Random(11))
        for _ in range(seed_accounts):
            workload.new_account()
    return f"crm: accounts table ready, seeded {seed_accounts} accounts"


class CrmWorkload:
    MIX: tuple[tuple[str, int], ...] = (
        ("new_account", 4),
        ("change_plan", 6),
        ("verify", 3),
        ("soft_delete", 1),
        ("hard_delete", 1),
    )

    def __init__(self, cur: Any, rng: random.Random) -> None:
        self.cur, self.rng = cur, rng

    def _pick(self) -> int | None:
        self.cur.execute("SELECT id FROM accounts WHERE deleted_at IS NULL ORDER BY RAND() LIMIT 1")
        row = self.cur.fetchone()
        return int(row[0]) if row else None

    def new_account(self) -> None:
        plan = self.rng.choice(list(PLANS))
        seats = self.rng.randint(1, 40)
        self.cur.execute(
            "INSERT INTO accounts (email, plan, seats, mrr, external_ref, profile) VALUES (%s, %s, %s, %s, %s, %s)",
            (
                f"user{uuid.uuid4().hex[:16]}@example.com",  # unique across runs with the same seed
                plan,
                seats,
                PLANS[plan] * seats,
                self.rng.getrandbits(64),  # the full unsigned range, beyond a signed long
                json.dumps({"locale": self.rng.choice(["en", "de", "fr"]), "beta": self.rng.random() < 0.2}),
            ),
        )

    def change_plan(self) -> None:
        if (account := self._pick()) is not None:
            plan = self.rng.choice(list(PLANS))
            self.cur.execute(
                "UPDATE accounts SET plan = %s, mrr = %s * seats WHERE id = %s", (plan, PLANS[plan], account)
            )

    def verify(self) -> None:
        if (account := self._pick()) is not None:
            self.cur.execute("UPDATE accounts SET verified = 1 WHERE id = %s", (account,))

    def soft_delete(self) -> None:
        if (account := self._pick()) is not None:
            self.cur.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id = %s", (account,))

    def hard_delete(self) -> None:
        if (account := self._pick()) is not None:
            self.cur.execute("DELETE FROM accounts WHERE id = %s", (account,))

    def step(self) -> str:
        names, weights = zip(*self.MIX, strict=True)
        name: str = self.rng.choices(names, weights=weights)[0]
        getattr(self, name)()
        return name
