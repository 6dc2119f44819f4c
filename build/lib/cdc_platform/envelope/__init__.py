"""The change-event model: pgoutput decoding, PostgreSQL value conversion, the
Debezium-compatible envelope, keys and the Kafka partitioner. Pure Python, no I/O."""
