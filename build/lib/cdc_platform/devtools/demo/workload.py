"""The shop workload: a steady mix of OLTP transactions (inserts, updates, deletes,
primary-key updates, multi-table transactions) as the shop application would run them."""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from datetime import time as dtime
from decimal import Decimal

import psycopg
from psycopg.types.json import Jsonb

from cdc_platform.devtools.demo.crm import CrmWorkload, crm_connect
from cdc_platform.devtools.stack.postgres import APP_ROLE, PASSWORD_ENVS
from cdc_platform.devtools.stack.profiles import StackProfile

TAGS = ["vip", "newsletter", "b2b", "wholesale", "returning", "flagged"]
METHODS = ["card", "paypal", "bank_transfer", "voucher"]
CITIES = ["Lisbon", "Oslo", "Tallinn", "Utrecht", "Porto", "Gdansk"]


@dataclass
class WorkloadStats:
    transactions: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    rows: Counter[str] = field(default_factory=Counter)  # "<table>.<insert|update|delete>"
    seconds: float = 0.0

    def summary(self) -> str:
        ops = ", ".join(f"{k}={v}" for k, v in sorted(self.operations.items()))
        rows = ", ".join(f"{k}={v}" for k, v in sorted(self.rows.items()))
        tps = self.transactions / self.seconds if self.seconds else 0.0
        return f"{self.transactions} transactions in {self.seconds:.1f} s ({tps:.1f}/s)\n  ops: {ops}\n  rows: {rows}"


def app_connect(profile: StackProfile, dbname: str = "shop") -> psycopg.Connection[tuple[object, ...]]:
    """The application's own TCP connection (password from the stack's env)."""
    return psycopg.connect(
        host="127.0.0.1",
        port=profile.pg_port,
        user=APP_ROLE,
        password=os.environ[PASSWORD_ENVS[APP_ROLE]],
        dbname=dbname,
        connect_timeout=5,
    )


def seed_shop(profile: StackProfile, customers: int = 200, products: int = 50, seed: int = 7) -> int:
    """Initial rows (only into an empty shop). Returns the number of customers created."""
    rng = random.Random(seed)
    with app_connect(profile) as conn:
        row = conn.execute("SELECT count(*) FROM customers").fetchone()
        if row and int(str(row[0])) > 0:
            return 0
        with conn.transaction():
            for i in range(products):
                _insert_product(conn, rng, i)
            for _ in range(customers):
                _insert_customer(conn, rng)
        gen = ShopWorkload(conn, rng)
        for _ in range(customers):
            gen.new_order()
    return customers


def _insert_product(conn: psycopg.Connection[tuple[object, ...]], rng: random.Random, i: int) -> None:
    conn.execute(
        """INSERT INTO products (sku, name, price, attributes, dimensions_cm, lead_time, active, thumbnail)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (sku) DO NOTHING""",
        (
            f"SKU-{i:05d}",
            f"Product {i}",
            Decimal(rng.randint(100, 99_999)) / 100,
            Jsonb({"color": rng.choice(["red", "blue", "black"]), "weight_g": rng.randint(10, 5000)}),
            [Decimal(rng.randint(100, 9999)) / 100 for _ in range(3)],
            timedelta(days=rng.randint(0, 30), hours=rng.randint(0, 23)),
            rng.random() > 0.1,
            bytes(rng.getrandbits(8) for _ in range(16)),
        ),
    )


def _insert_customer(conn: psycopg.Connection[tuple[object, ...]], rng: random.Random) -> int:
    n = rng.getrandbits(48)
    row = conn.execute(
        """INSERT INTO customers (email, full_name, birth_date, preferred_contact, tags, loyalty_points)
           VALUES (%s, %s, %s, %s, %s, %s) RETURNING id""",
        (
            # unique across runs even with a fixed --seed (the seed shapes the mix, not identities)
            f"user{n}.{uuid.uuid4().hex[:10]}@example.com",
            rng.choice(["Ana", "Bo", "Chen", "Dara", "Emil", "Fatima"]) + f" {n % 10_000}",
            date(1950, 1, 1) + timedelta(days=rng.randint(0, 20_000)) if rng.random() > 0.2 else None,
            dtime(rng.randint(8, 19), rng.choice([0, 15, 30, 45])),
            rng.sample(TAGS, rng.randint(0, 3)),
            rng.randint(0, 500),
        ),
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


class ShopWorkload:
    """One method per kind of business transaction; each runs in its own transaction."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]], rng: random.Random) -> None:
        self.conn = conn
        self.rng = rng
        self.stats = WorkloadStats()

    def _count(self, table: str, op: str, n: int = 1) -> None:
        self.stats.rows[f"{table}.{op}"] += n

    def _pick(self, query: str) -> tuple[object, ...] | None:
        return self.conn.execute(query).fetchone()

    def new_customer(self) -> None:
        _insert_customer(self.conn, self.rng)
        self._count("customers", "insert")

    def new_order(self) -> None:
        customer = self._pick("SELECT id FROM customers ORDER BY random() LIMIT 1")
        if customer is None:
            return self.new_customer()
        address = {"city": self.rng.choice(CITIES), "zip": f"{self.rng.randint(1000, 9999)}"}
        order = self.conn.execute(
            "INSERT INTO orders (customer_id, shipping_address, notes) VALUES (%s, %s, %s) RETURNING id",
            (customer[0], Jsonb(address), self.rng.choice([None, "leave at door", 'gift: "wrap it" ✓'])),
        ).fetchone()
        assert order is not None
        self._count("orders", "insert")
        lines = self.rng.randint(1, 4)
        for line_no in range(1, lines + 1):
            self.conn.execute(
                """INSERT INTO order_lines (order_id, line_no, product_id, quantity, unit_price)
                   SELECT %s, %s, id, %s, price FROM products ORDER BY random() LIMIT 1""",
                (order[0], line_no, self.rng.randint(1, 5)),
            )
        self._count("order_lines", "insert", lines)
        self.conn.execute(
            """UPDATE orders SET total = (SELECT coalesce(sum(quantity * unit_price), 0)
               FROM order_lines WHERE order_id = %s) WHERE id = %s""",
            (order[0], order[0]),
        )
        self._count("orders", "update")
        self._audit("order.created", {"order_id": order[0]})
        return None

    def pay_order(self) -> None:
        order = self._pick("SELECT id, total FROM orders WHERE status = 'pending' ORDER BY random() LIMIT 1")
        if order is None:
            return self.new_order()
        self.conn.execute(
            "INSERT INTO payments (order_id, amount, method, raw_response) VALUES (%s, %s, %s, %s)",
            (
                order[0],
                order[1],
                self.rng.choice(METHODS),
                Jsonb({"ok": True, "ref": self.rng.getrandbits(32)}),
            ),
        )
        self._count("payments", "insert")
        self.conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (order[0],))
        self._count("orders", "update")
        return None

    def advance_order(self) -> None:
        moved = self.conn.execute(
            """UPDATE orders SET status = CASE status WHEN 'paid' THEN 'shipped'::order_status
                                                      ELSE 'delivered'::order_status END
               WHERE id = (SELECT id FROM orders WHERE status IN ('paid', 'shipped')
                           ORDER BY random() LIMIT 1)"""
        ).rowcount
        self._count("orders", "update", moved)

    def cancel_order(self) -> None:
        order = self._pick("SELECT id FROM orders WHERE status = 'pending' ORDER BY random() LIMIT 1")
        if order is None:
            return None
        deleted = self.conn.execute("DELETE FROM order_lines WHERE order_id = %s", (order[0],)).rowcount
        self._count("order_lines", "delete", deleted)
        self.conn.execute("UPDATE orders SET status = 'cancelled', total = 0 WHERE id = %s", (order[0],))
        self._count("orders", "update")
        self._audit("order.cancelled", {"order_id": order[0]})
        return None

    def renumber_line(self) -> None:
        """A primary-key update: capture must emit delete(old key) + create(new key)."""
        line = self._pick("SELECT order_id, line_no FROM order_lines ORDER BY random() LIMIT 1")
        if line is None:
            return
        moved = self.conn.execute(
            """UPDATE order_lines SET line_no = (SELECT max(line_no) + 1 FROM order_lines WHERE order_id = %s)
               WHERE order_id = %s AND line_no = %s""",
            (line[0], line[0], line[1]),
        ).rowcount
        self._count("order_lines", "update", moved)

    def reprice_product(self) -> None:
        changed = self.conn.execute(
            """UPDATE products SET price = round(price * %s, 2),
                      attributes = attributes || jsonb_build_object('repriced', now()::text)
               WHERE id = (SELECT id FROM products ORDER BY random() LIMIT 1)""",
            (Decimal(self.rng.choice(["0.90", "0.95", "1.05", "1.10"])),),
        ).rowcount
        self._count("products", "update", changed)

    def touch_customer(self) -> None:
        changed = self.conn.execute(
            """UPDATE customers SET loyalty_points = loyalty_points + %s,
                      tags = CASE WHEN %s = ANY(tags) THEN array_remove(tags, %s) ELSE tags || %s::text END,
                      updated_at = now()
               WHERE id = (SELECT id FROM customers ORDER BY random() LIMIT 1)""",
            (self.rng.randint(1, 50), *(self.rng.choice(TAGS),) * 3),
        ).rowcount
        self._count("customers", "update", changed)

    def delete_customer(self) -> None:
        deleted = self.conn.execute(
            """DELETE FROM customers WHERE id = (SELECT c.id FROM customers c
               WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id)
               ORDER BY random() LIMIT 1)"""
        ).rowcount
        self._count("customers", "delete", deleted)

    def prune_audit(self) -> None:
        deleted = self.conn.execute(
            """DELETE FROM audit_events WHERE event_id IN
               (SELECT event_id FROM audit_events ORDER BY occurred_at LIMIT 2)"""
        ).rowcount
        self._count("audit_events", "delete", deleted)

    def _audit(self, action: str, payload: dict[str, object]) -> None:
        self.conn.execute(
            "INSERT INTO audit_events (actor, action, payload) VALUES (%s, %s, %s)",
            (self.rng.choice(["web", "api", "backoffice"]), action, Jsonb(json.loads(json.dumps(payload)))),
        )
        self._count("audit_events", "insert")

    # relative frequency of each business transaction
    MIX: tuple[tuple[str, int], ...] = (
        ("new_customer", 8),
        ("new_order", 25),
        ("pay_order", 18),
        ("advance_order", 14),
        ("cancel_order", 5),
        ("renumber_line", 3),
        ("reprice_product", 8),
        ("touch_customer", 12),
        ("delete_customer", 3),
        ("prune_audit", 4),
    )

    def step(self) -> str:
        names, weights = zip(*self.MIX, strict=True)
        name: str = self.rng.choices(names, weights=weights)[0]
        with self.conn.transaction():
            getattr(self, name)()
        self.stats.transactions += 1
        self.stats.operations[name] += 1
        return name


def run_workload(
    profile: StackProfile,
    rate: float,
    seconds: float,
    seed: int | None = None,
    log: Callable[[str], None] | None = None,
) -> WorkloadStats:
    """Run transactions at ``rate`` per second for ``seconds`` (0 = until interrupted)."""
    if rate <= 0:
        raise ValueError("--rate must be > 0 transactions per second")
    rng = random.Random(seed)
    start = time.monotonic()
    with app_connect(profile) as conn, crm_connect(profile) as crm, crm.cursor() as crm_cur:
        conn.autocommit = True  # each step opens its own transaction block
        gen = ShopWorkload(conn, rng)
        crm_gen = CrmWorkload(crm_cur, rng)  # the polled MariaDB source: one step in four
        next_at = start
        last_report = start
        try:
            while seconds <= 0 or time.monotonic() - start < seconds:
                gen.step()
                if rng.random() < 0.25:
                    gen.stats.operations[f"crm.{crm_gen.step()}"] += 1
                next_at += 1.0 / rate
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if log and time.monotonic() - last_report >= 10:
                    last_report = time.monotonic()
                    log(f"workload: {gen.stats.transactions} transactions")
        except KeyboardInterrupt:
            pass
    gen.stats.seconds = time.monotonic() - start
    return gen.stats
