"""The only Dagster code: keys, partitions, resources (own the I/O), assets, sensors,
metadata, the error mapping and the lazily built definitions. Asset bodies call core
functions that return typed results; ``metadata.py`` turns those into what the UI shows."""
