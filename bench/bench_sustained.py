"""Sustained rate: the highest change rate capture and the stream apply keep up with.

A 100k-row table in the dev stack; capture streams it (a thread, as the long-running
process would) and the stream apply runs continuously (``run_forever``, what
``cdc-platform apply`` runs). A writer offers a stepped change rate: every 0.1 s one
transaction updates ``rate / 10`` consecutive rows (one change event each). Every second
the backlog is sampled: changes committed but not yet in Kafka (capture's), and offsets
in Kafka that current has not applied (the apply's). A step is **kept up with** when the
apply's backlog at the end of the step is no larger than at its first third plus one
second of changes: it stays flat instead of growing. Before the first step the writer runs
``--warmup-s`` at the first step's rate, not counted: a long-running apply is warm (its JIT
compiled, its caches built), and a cold one's first minute of catching up would otherwise
decide the first step's verdict. Each step also prints the apply's lag in seconds
(backlog over the committed rate) at its first and last third.

Floor in the same run: capture alone (the changes reach Kafka at that rate); the ratio is
the highest rate kept up with over issue 16's target of 10 000 changes/s.

Run: .venv/bin/python bench/bench_sustained.py [--rates 10000 12000] [--step-s 180] [--warmup-s 90]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

import bench_lake

from cdc_platform.config.model import ApplyConfig, ApplyEngine
from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import profile
from cdc_platform.lake.apply import StreamApply
from cdc_platform.lake.session import get_spark_session
from cdc_platform.sources import CaptureSettings, open_source

bench_lake.TABLE = "bench_sustained_rows"
ROWS = 100_000
TARGET = 10_000
UPDATE = f"UPDATE {bench_lake.TABLE} SET amount = amount + 1 WHERE id BETWEEN %s AND %s"


@dataclass
class Step:
    rate: int
    committed: int = 0
    seconds: float = 0.0
    capture_backlog: list[int] = field(default_factory=list)
    apply_backlog: list[int] = field(default_factory=list)

    @property
    def achieved(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0

    def third(self, backlog: list[int], which: int) -> float:
        n = max(1, len(backlog) // 3)
        part = backlog[:n] if which == 0 else backlog[-n:]
        return statistics.mean(part) if part else 0.0

    def trend_s_per_min(self) -> float:
        """The apply's lag trend: least-squares slope of its backlog (one sample a second),
        in seconds of changes per minute; about 0 when it keeps up, positive when it falls behind."""
        ys = self.apply_backlog
        if len(ys) < 2 or not self.achieved:
            return 0.0
        slope = statistics.linear_regression(range(len(ys)), ys).slope
        return slope * 60 / self.achieved

    def kept_up(self, backlog: list[int]) -> bool:
        return self.third(backlog, -1) <= self.third(backlog, 0) + self.achieved


class SustainedRun:
    def __init__(self, args: argparse.Namespace, tag: str) -> None:
        self.args = args
        self.config = bench_lake.prepare(ROWS, tag)
        self.table = self.config.tables[0]
        self.lake = Lake(self.config, get_spark_session(self.config.spark.model_copy(update={"master": "local[*]"})))
        self.committed = 0
        self.stop = threading.Event()
        self.engine: StreamApply | None = None

    def write_step(self, step: Step, seconds: float) -> None:
        """``step.rate`` changes/s for ``seconds``, sampling the backlogs each second."""
        per_tx = max(1, step.rate // 10)
        started, next_sample, cursor = time.monotonic(), time.monotonic() + 1, 0
        with app_connect(profile("dev")) as app:
            while (now := time.monotonic()) - started < seconds:
                low = cursor % ROWS + 1
                high = min(ROWS, low + per_tx - 1)
                app.execute(UPDATE, (low, high))
                app.commit()
                cursor += high - low + 1
                self.committed += high - low + 1
                step.committed += high - low + 1
                if now >= next_sample:
                    self.sample(step)
                    next_sample += 1
                time.sleep(max(0.0, 0.1 - (time.monotonic() - now)))
        step.seconds = time.monotonic() - started

    def sample(self, step: Step) -> None:
        in_kafka = sum(self.lake.kafka.end_offsets(self.config.topic_for(self.table)).values())
        assert self.engine is not None
        position = self.engine.positions().get(self.table.key)
        applied = sum(position[0].frontier.values()) if position else 0
        step.capture_backlog.append(max(0, self.committed - in_kafka))
        step.apply_backlog.append(max(0, in_kafka - applied))

    def apply(self) -> None:
        settings = ApplyConfig(engine=ApplyEngine.STREAM, trigger_interval_s=0.5)
        tables = [self.lake.table(self.table.key)]
        with StreamApply(self.lake.spark, self.lake.ledger, self.lake.kafka, tables, settings) as engine:
            self.engine = engine
            engine.run_forever(self.stop, lambda _applied: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[10000, 12000])
    parser.add_argument("--step-s", type=float, default=180.0)
    parser.add_argument("--warmup-s", type=float, default=90.0)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    run = SustainedRun(args, tag)
    capture = open_source(run.config, "shop").capture(CaptureSettings(status_interval_s=1))
    steps: list[Step] = []
    applying = threading.Thread(target=run.apply, daemon=True)
    try:
        open_source(run.config, "shop").capture(CaptureSettings(until_caught_up=True)).run()  # slot and topic
        run.lake.snapshot(run.table.key, "g1")
        threading.Thread(target=capture.run, daemon=True).start()
        applying.start()
        while run.engine is None or not run.engine.positions():
            time.sleep(1)
        if args.warmup_s > 0:
            warmup = Step(args.rates[0])
            run.write_step(warmup, args.warmup_s)
            print(f"warm-up  {describe(warmup)}  (not counted)", flush=True)
        for rate in args.rates:
            step = Step(rate)
            run.write_step(step, args.step_s)
            steps.append(step)
            print(describe(step), flush=True)
    finally:
        run.stop.set()
        capture.stop()
        if applying.is_alive():  # its batch finished before the topic goes (an exit mid-batch crashed in native code)
            applying.join(timeout=180)
        bench_lake.cleanup(run.config, tag)
    report(steps)


def describe(step: Step) -> str:
    verdict = "kept up" if step.kept_up(step.apply_backlog) else "FELL BEHIND"
    first, last = step.third(step.apply_backlog, 0), step.third(step.apply_backlog, -1)
    rate = max(step.achieved, 1.0)
    return (
        f"offered {step.rate:>6}/s  committed {step.achieved:8.0f}/s  capture backlog end "
        f"{step.capture_backlog[-1] if step.capture_backlog else 0:>7}  apply backlog first third "
        f"{first:9.0f} ({first / rate:5.1f} s)  last third {last:9.0f} ({last / rate:5.1f} s)  "
        f"lag trend {step.trend_s_per_min():+5.1f} s/min  {verdict}"
    )


def report(steps: list[Step]) -> None:
    capture_kept = [s.achieved for s in steps if s.kept_up(s.capture_backlog)]
    apply_kept = [s.achieved for s in steps if s.kept_up(s.apply_backlog)]
    floor, best = max(capture_kept, default=0.0), max(apply_kept, default=0.0)
    print("\nsustained rate (one table, stream apply, 2 cores; the writer's offered rate in steps)")
    print(f"  floor: capture keeps up with       {floor:8.0f} changes/s")
    print(f"  the apply keeps up with            {best:8.0f} changes/s   /floor {best / max(floor, 1):.2f}   "
          f"/target {TARGET} = {best / TARGET:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
