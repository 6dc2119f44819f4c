"""Names the table and the reason of every failed run in the sensor's log."""

import dagster as dg

from cdc_platform.orchestration.keys import TAG_REASON, TAG_TABLE


def failure_report(tags: dict[str, str], message: str) -> str:
    table = tags.get(TAG_TABLE, "unknown table")
    reason = tags.get(TAG_REASON)
    where = f"{table} (rehydration: {reason})" if reason else table
    return f"run for {where} failed: {message}"


def describe_failure(context: dg.RunFailureSensorContext) -> str:
    messages = []
    for event in context.get_step_failure_events():
        data = event.step_failure_data
        if data.user_failure_data is not None and data.user_failure_data.description:
            messages.append(data.user_failure_data.description)  # our dg.Failure: the message with the fix
        else:
            messages.append(str(data.error.message).strip() if data.error else "unknown error")
    message = "; ".join(messages) or (context.failure_event.message or "run failed")
    return failure_report(dict(context.dagster_run.tags), message)


@dg.run_failure_sensor(name="cdc_run_failures", default_status=dg.DefaultSensorStatus.RUNNING)
def cdc_run_failures(context: dg.RunFailureSensorContext) -> None:
    """Names the table and the reason of every failed run in the sensor's log."""
    context.log.error(describe_failure(context))
