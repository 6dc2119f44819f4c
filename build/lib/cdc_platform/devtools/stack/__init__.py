"""The local stack (PostgreSQL + Kafka) that the demo and the tests run against.

Started and stopped by ``cdc-platform dev up|down|status``. Everything lives under
``.cdc/<profile>/`` in the repo; only processes recorded in our own pid files are stopped.
"""

from cdc_platform.devtools.stack.profiles import PROFILES, StackProfile, profile
from cdc_platform.devtools.stack.stack import StackError, stack_down, stack_status, stack_up

__all__ = ["PROFILES", "StackError", "StackProfile", "profile", "stack_down", "stack_status", "stack_up"]
