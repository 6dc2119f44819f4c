"""The lake: Delta tables written with Spark (snapshots, changelog, current, history,
dead letters) and the pipeline-state ledger (delta-rs). No Dagster here."""
