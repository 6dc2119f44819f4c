-- The demo shop: a small OLTP schema exercising the types capture must carry exactly.
-- Idempotent: safe to run on every `cdc-platform demo setup`.
DO $$ BEGIN
  CREATE TYPE order_status AS ENUM ('pending', 'paid', 'shipped', 'delivered', 'cancelled');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

CREATE TABLE IF NOT EXISTS customers (
  id                bigserial PRIMARY KEY,
  external_id       uuid NOT NULL DEFAULT gen_random_uuid(),
  email             text NOT NULL UNIQUE,
  full_name         text NOT NULL,
  birth_date        date,
  preferred_contact time,
  tags              text[] NOT NULL DEFAULT '{}',
  loyalty_points    integer NOT NULL DEFAULT 0,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS products (
  id             serial PRIMARY KEY,
  sku            text NOT NULL UNIQUE,
  name           text NOT NULL,
  price          numeric(12, 2) NOT NULL CHECK (price >= 0),
  attributes     jsonb NOT NULL DEFAULT '{}',
  dimensions_cm  numeric(8, 2)[],
  lead_time      interval,
  active         boolean NOT NULL DEFAULT true,
  thumbnail      bytea,
  created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS orders (
  id                bigserial PRIMARY KEY,
  customer_id       bigint NOT NULL REFERENCES customers(id),
  status            order_status NOT NULL DEFAULT 'pending',
  placed_at         timestamptz NOT NULL DEFAULT now(),
  total             numeric(14, 2) NOT NULL DEFAULT 0,
  shipping_address  jsonb,
  notes             text
);

-- composite primary key: capture keys and merges must handle more than one key column
CREATE TABLE IF NOT EXISTS order_lines (
  order_id    bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
  line_no     integer NOT NULL,
  product_id  integer NOT NULL REFERENCES products(id),
  quantity    integer NOT NULL CHECK (quantity > 0),
  unit_price  numeric(12, 2) NOT NULL,
  PRIMARY KEY (order_id, line_no)
);

-- non-numeric (uuid) primary key: snapshots split it by hash buckets, not ranges
CREATE TABLE IF NOT EXISTS payments (
  id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  order_id     bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
  amount       numeric(14, 2) NOT NULL,
  method       text NOT NULL,
  paid_at      timestamptz NOT NULL DEFAULT now(),
  raw_response jsonb
);

-- no primary key on purpose: the config names event_id as the key, and capture needs
-- REPLICA IDENTITY FULL to see whole old rows for updates and deletes
CREATE TABLE IF NOT EXISTS audit_events (
  event_id     uuid NOT NULL DEFAULT gen_random_uuid(),
  occurred_at  timestamptz NOT NULL DEFAULT now(),
  actor        text NOT NULL,
  action       text NOT NULL,
  payload      jsonb
);
ALTER TABLE audit_events REPLICA IDENTITY FULL;

CREATE INDEX IF NOT EXISTS orders_customer_idx ON orders (customer_id);
CREATE INDEX IF NOT EXISTS payments_order_idx ON payments (order_id);
CREATE INDEX IF NOT EXISTS audit_events_occurred_idx ON audit_events (occurred_at);

-- Debezium-style signal table: a row ('<id>', 'rehydrate', 'public.orders') asks the
-- rehydration sensor for a new generation of that table (read with SELECT only).
CREATE TABLE IF NOT EXISTS cdc_signals (
    id   varchar(42) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data varchar(2048)
);
