"""The sensors: closed changelog windows, rehydration, run failures. Each receives its
resources and reads the ledger; decisions are pure functions in ``model/``."""
