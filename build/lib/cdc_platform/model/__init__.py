"""Pure rules and records: errors and their classes, coverage of offsets, generations,
changelog windows, rehydration decisions, schema compatibility, table shapes. No I/O."""
