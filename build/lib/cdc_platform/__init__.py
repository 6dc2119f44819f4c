"""cdc_platform: operational tables into a Delta lake, correctly, as Dagster assets."""

__version__ = "0.1.0"
