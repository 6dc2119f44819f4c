"""The fault suite's accounting rule: after each fault, the ledger's offsets are exactly the
changelog's records plus the dead letters, each record once."""

from cdc_platform.devtools.faults import records_balance


def test_every_offset_in_the_changelog_or_dead_letters_balances() -> None:
    assert records_balance(offsets=100, changelog_rows=97, distinct_records=97, dead_letters=3)


def test_a_lost_record_does_not_balance() -> None:
    assert not records_balance(offsets=100, changelog_rows=96, distinct_records=96, dead_letters=3)


def test_a_record_twice_and_another_lost_does_not_balance_though_the_sum_does() -> None:
    # 97 rows for 97 offsets, but one record is there twice: 96 distinct records
    assert not records_balance(offsets=100, changelog_rows=97, distinct_records=96, dead_letters=3)
