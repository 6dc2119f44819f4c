"""Source connectors: PostgreSQL logical decoding (and, later, query-based polling)."""
