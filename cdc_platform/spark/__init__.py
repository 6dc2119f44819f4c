"""Spark: session settings, Delta IO (and, as they land, Kafka range reads and merges)."""
