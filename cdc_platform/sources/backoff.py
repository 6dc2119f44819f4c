"""Waiting between retries of retriable errors, shared by every capture's run loop and the
continuous apply's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_platform.model.errors import CdcError, RetriableError

log = logging.getLogger("cdc_platform.capture")


class Backoff:
    """Waits 0.5 s, doubling up to ``max_wait_s``; after ``give_up_after_s`` of failing
    without a success in between (None: never) the error is raised instead."""

    def __init__(
        self, max_wait_s: float, give_up_after_s: float | None, sleep: Callable[[float], object] = time.sleep,
        logger: logging.Logger = log,
    ) -> None:  # fmt: skip
        self.max_wait_s, self.give_up_after_s, self.sleep, self.log = max_wait_s, give_up_after_s, sleep, logger
        self.reset()

    def reset(self) -> None:
        """A success: the next failure starts from the shortest wait."""
        self.wait = 0.5
        self.failing_since: float | None = None

    def failed(self, error: CdcError) -> None:
        now = time.monotonic()
        self.failing_since = self.failing_since or now
        if self.give_up_after_s is not None and now - self.failing_since > self.give_up_after_s:
            raise RetriableError(f"{error} (gave up after {self.give_up_after_s:.0f} s)") from None
        self.log.warning("%s; retrying in %.1f s", error, self.wait)
        self.sleep(self.wait)
        self.wait = min(self.wait * 2, self.max_wait_s)
