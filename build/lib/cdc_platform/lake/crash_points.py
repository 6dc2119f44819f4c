"""Named instants where fault injection ends the process, as SIGKILL would.

``CDC_FAULT_EXIT_AT=<name>`` makes the process exit at once (no cleanup, no flush, exit
status 137) the first time it reaches the point of that name: the fault suite and the
recovery tests use it to cut the stream apply between its steps, which a SIGKILL from
outside hits only by chance. Unset (always, outside those tests) it costs one lookup.
"""

from __future__ import annotations

import os

ENV = "CDC_FAULT_EXIT_AT"
# the stream apply's steps, in the order a batch passes them
APPLY_POINTS = (
    "apply.planned",  # a batch planned in the ledger, nothing written
    "apply.changelog_written",  # the changelog append committed, its ranges not recorded
    "apply.recorded",  # the ranges recorded, current not merged
    "current.merged",  # current merged, its frontier not recorded
)
SNAPSHOT_POINTS = ("snapshot.wave_written",)  # a wave of a chunked generation appended, its chunks not recorded
POINTS = APPLY_POINTS + SNAPSHOT_POINTS


def crash_point(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get(ENV) == name:
        os._exit(137)
