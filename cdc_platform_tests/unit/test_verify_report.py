"""What `cdc-platform verify` prints: a line per table as it finishes (a verify of many
tables runs for minutes under one timeout), and the verdicts' table with each one's time."""

from cdc_platform.lake.verify import Verdict, format_verdicts, progress_line


def test_each_finished_table_says_its_result_time_and_the_timeout_spent() -> None:
    verdict = Verdict("shop.public.orders", source_rows=10, current_rows=10, waited_s=48.4)
    line = progress_line(verdict, 3, 10, 131.2, 600)
    assert line == "shop.public.orders: ok after 48 s; 3/10 tables done, 131 s of the 600 s timeout spent"

    differs = Verdict("shop.public.orders", missing=2, waited_s=7)
    assert progress_line(differs, 1, 2, 7.0, 600).startswith("shop.public.orders: DIFFERS after 7 s; 1/2")
    unverified = Verdict("crm.crm.accounts", note="current has not applied up to the start position", waited_s=600)
    assert "NOT VERIFIED after 600 s; 2/2 tables done, 600 s of the 600 s" in progress_line(unverified, 2, 2, 600, 600)


def test_the_verdicts_table_has_each_tables_seconds() -> None:
    table = format_verdicts(
        [Verdict("a.b.fast", source_rows=5, current_rows=5, waited_s=3.2), Verdict("a.b.slow", waited_s=95.7)]
    )
    header, fast, slow = table.splitlines()[:3]
    assert header.split()[-2:] == ["seconds", "result"]
    assert fast.split()[-2:] == ["3", "ok"] and slow.split()[-2:] == ["96", "ok"]
