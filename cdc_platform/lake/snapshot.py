"""A snapshot generation: the source's plan read in parallel by Spark into Delta, validated,
and only then committed in the ledger.

The source (``sources/<kind>/snapshot.py``) takes the watermark and holds one state of
the table; this module reads that state with Spark JDBC, converts it to lake types and
writes ``<table>/snapshot/<generation>``. The generation's life is recorded in the
ledger: ``running`` when it starts, ``committed`` (with watermark, rows and the resolved
schema) only after the written rows pass validation, ``failed`` (with the reason)
otherwise. The lake never uses a generation that is not committed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.config.model import SnapshotMode
from cdc_platform.kafka.clients import KafkaClients
from cdc_platform.lake.crash_points import crash_point
from cdc_platform.lake.errors import VALUE_REFUSED, classify_spark_error
from cdc_platform.lake.key_proof import SliceSummary, proven_unique, slice_summaries, statistics_summaries
from cdc_platform.lake.lake_types import lake_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import LakeTable, parquet_dictionary_off, quote_spark, table_options
from cdc_platform.model.chunks import ChunkPlan, ChunkProgress, WaveProgress
from cdc_platform.model.errors import CdcError, GenerationRejectedError
from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
from cdc_platform.model.state import SchemaRecord
from cdc_platform.sources.base import JdbcRead, SnapshotPlan, Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("cdc_platform.snapshot")

PROGRESS_INTERVAL_S = 10.0
# chunks per wave (one Delta commit and one ledger record each), per Spark core. A wave costs
# ~0.6 s beyond its reads and writes (a job, its stragglers, two commits): with 4 a 10M-row
# generation spent 23-25 s in 13 waves, with 16 18 s in 4 (docs/benchmarks.md). A crash
# loses at most one wave: about 16 chunk reads per core, seconds at the default chunk size.
WAVE_TASKS_PER_CORE = 16
WAVE_METADATA = "cdc_platform wave "  # each wave's commit says which it is (userMetadata)


@dataclass
class SnapshotResult:
    generation: str
    path: str
    rows: int
    source_rows: int
    bytes: int
    watermark: Watermark
    position: str  # the watermark's source position as users know it (LSN, or a time)
    duration_s: float
    schema_hash: str
    spark_partitions: int
    key_columns: tuple[str, ...]
    columns: list[tuple[str, str]] = field(default_factory=list)  # (name, lake type)
    schema_json: str = ""  # the resolved TableSchema the generation was read with
    source_note: str | None = None  # what the source prepared for this generation
    consistent: bool = True  # one exported snapshot for every chunk (else each chunk its own transaction)


@dataclass(frozen=True)
class GenerationRequest:
    """Who asked for a generation and why (recorded with it in the ledger)."""

    generation: str
    reason: str = "manual"
    cause: str = ""
    run_id: str = ""


def take_generation(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable,
    request: GenerationRequest, log_progress: Callable[[str], None] = log.info,
    report_wave: Callable[[WaveProgress], None] | None = None,
) -> SnapshotResult:  # fmt: skip
    """Take, validate and commit one generation; record ``failed`` (and raise) otherwise.
    ``report_wave``: told where a chunked generation stands after each wave (the UI's
    progress), as the run log is."""
    event = GenerationEvent(table.key, request.generation, GenerationStatus.RUNNING, reason=request.reason,
                            cause=request.cause, run_id=request.run_id)  # fmt: skip
    ledger.record_generation(event)
    try:
        note = source.prepare_generation(request.reason)
        progress = _Progress(log_progress, report_wave or (lambda _wave: None))
        result = _write_generation(spark, ledger, source, kafka, table, request.generation, progress)
        result.source_note = note
    except BaseException as exc:
        error = exc if isinstance(exc, CdcError) else classify_spark_error(exc, f"snapshot of {table.key}")
        failed = GenerationEvent(table.key, request.generation, GenerationStatus.FAILED, run_id=request.run_id,
                                 detail=f"{error.kind}: {error}"[:4000])  # fmt: skip
        ledger.record_generation(failed)
        if error is exc or not isinstance(exc, Exception):
            raise
        raise error from exc
    _commit(ledger, table, request, result)
    return result


def _commit(ledger: Ledger, table: LakeTable, request: GenerationRequest, result: SnapshotResult) -> None:
    schema_json = result.schema_json
    history = ledger.schema_history(table.key)
    version = (history[-1].version + 1) if history else 1
    # the generation read the source as it is: its schema starts a new baseline
    ledger.register_schema(
        table.key,
        SchemaRecord(version, request.generation, _fingerprint(schema_json), schema_json,
                     f"baseline of generation {request.generation}"),
    )  # fmt: skip
    ledger.record_generation(
        GenerationEvent(table.key, request.generation, GenerationStatus.COMMITTED, run_id=request.run_id,
                        watermark=result.watermark, rows=result.rows, schema_json=schema_json)
    )  # fmt: skip


def _fingerprint(schema_json: str) -> str:
    from cdc_platform.model.tables import TableSchema

    return TableSchema.from_json(schema_json).version().fingerprint()


@dataclass(frozen=True)
class _Progress:
    log: Callable[[str], None]
    wave: Callable[[WaveProgress], None]


def _write_generation(
    spark: SparkSession, ledger: Ledger, source: Source, kafka: KafkaClients, table: LakeTable, generation: str,
    progress_to: _Progress,
) -> SnapshotResult:  # fmt: skip
    log_progress = progress_to.log
    started = time.monotonic()
    path = table.snapshot_path(generation)
    consistent = table.config.snapshot.mode == SnapshotMode.EXPORTED
    chunked = not consistent and source.capabilities.resumable_snapshots
    progress = ledger.chunk_progress(table.key, generation) if chunked else ChunkProgress(None)
    with source.snapshot(table.config, kafka, table.topic, consistent, progress.plan) as plan:
        position = source.format_position(plan.watermark.position)
        log_progress(
            f"{table.key}: snapshot {generation}: {plan.source_rows} rows at watermark {position}, "
            f"{len(plan.read.predicates)} chunk(s), "
            f"{'one exported snapshot' if plan.consistent else 'each chunk in its own transaction'}"
            + (f", resumed with {len(progress.written)} chunk(s) written before" if plan.resumed else "")
        )
        with parquet_dictionary_off(spark, plan.distinct_columns) as plain:
            if plain:
                log.info("%s: snapshot %s: no Parquet dictionary for %s (nearly unique)", table.key, generation, plain)
            if chunked:
                _write_waves(spark, ledger, table, generation, plan, progress, progress_to)
            else:
                with SparkProgress(spark, f"{table.key}: snapshot {generation}", plan.source_rows, log_progress):
                    frame = read_plan(spark, plan)
                    frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").options(
                        **table_options(frame.schema, statistics_on=plan.schema.key)
                    ).save(path)
    rows = validate(spark, path, plan, source.capabilities.exact_snapshot_count and plan.consistent)
    result = SnapshotResult(
        generation, path, rows, plan.source_rows, table_bytes(spark, path), plan.watermark, position,
        round(time.monotonic() - started, 3), plan.schema_hash, len(plan.read.predicates), plan.schema.key,
        [(c.name, lake_type(c.pgtype, c.typmod, c.dims).simpleString()) for c in plan.schema.columns],
        plan.schema.to_json(), consistent=plan.consistent,
    )  # fmt: skip
    log_progress(
        f"{table.key}: snapshot {generation}: wrote {rows} rows ({result.bytes} bytes) in {result.duration_s} s"
    )
    return result


def _write_waves(
    spark: SparkSession, ledger: Ledger, table: LakeTable, generation: str, plan: SnapshotPlan,
    progress: ChunkProgress, progress_to: _Progress,
) -> None:  # fmt: skip
    """The plan's chunks, a wave at a time (``model.chunks``): each wave one Delta append
    whose transaction version is the wave's number, then its chunks recorded in the
    ledger. A new plan is recorded first and starts from an empty table; a resumed one
    skips the chunks recorded."""
    from delta.tables import DeltaTable

    path = table.snapshot_path(generation)
    written = set(progress.written) if plan.resumed and DeltaTable.isDeltaTable(spark, path) else set()
    chunk_plan = progress.plan if plan.resumed and progress.plan is not None else None
    if chunk_plan is None:
        per_wave = table.config.snapshot.chunks_per_wave or max(
            1, spark.sparkContext.defaultParallelism * WAVE_TASKS_PER_CORE
        )
        chunk_plan = ChunkPlan(
            generation, plan.watermark, plan.schema_hash, plan.source_rows, per_wave, plan.read.predicates
        )
        remove_path(spark, path)  # rows of an earlier plan (the table's shape changed) are not this plan's
        ledger.plan_chunks(table.key, chunk_plan)
    app_id = f"cdc_platform snapshot {table.key} {generation} {chunk_plan.watermark.taken_at.isoformat()}"
    types = {c.name: lake_type(c.pgtype, c.typmod, c.dims) for c in plan.schema.columns}
    total, started, done_before = len(chunk_plan.predicates), time.monotonic(), len(written)
    for number, chunks in chunk_plan.waves_left(written):
        read = replace(plan.read, predicates=tuple(chunk_plan.predicates[c] for c in chunks))
        frame = read_jdbc(spark, read, types)
        frame.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", number).option(
            "userMetadata", f"{WAVE_METADATA}{number}"
        ).options(**table_options(frame.schema, statistics_on=plan.schema.key)).save(path)
        crash_point("snapshot.wave_written")
        ledger.record_chunks_written(table.key, generation, chunks)
        written |= set(chunks)
        # rows from chunks: they hold equal shares of the table as planned (no count per wave)
        per_chunk = chunk_plan.source_rows / total
        standing = WaveProgress(
            len(written), total, round(len(written) * per_chunk), chunk_plan.source_rows,
            time.monotonic() - started, round((len(written) - done_before) * per_chunk),
        )  # fmt: skip
        progress_to.log(standing.line(f"{table.key}: snapshot {generation}"))
        progress_to.wave(standing)
    _check_waves(spark, path, table.key, chunk_plan)


def _check_waves(spark: SparkSession, path: str, key: str, chunk_plan: ChunkPlan) -> None:
    """The snapshot table must be the plan's waves and nothing else: every wave a commit of
    it, and no other commit (a DELETE, a RESTORE, an overwrite: rows the ledger records as
    written may be gone). Validation cannot catch that, since chunks read at different
    instants have no row count to compare with."""
    history = wave_history(spark, path)
    waves = {wave for _, _, wave in history if wave is not None}
    foreign = [f"{operation} at version {version}" for version, operation, wave in history if wave is None]
    missing = sorted({n for n, _ in chunk_plan.waves()} - waves)
    if missing or foreign:
        found = f"lacks wave(s) {missing[:10]}" if missing else f"was changed ({', '.join(sorted(foreign)[:5])})"
        raise GenerationRejectedError(
            f"{key}: the snapshot table {path} {found} while the generation ran, so rows the ledger records as "
            f"written may be missing; the generation is not used (take a new one: cdc-platform rehydrate {key})"
        )


def wave_history(spark: SparkSession, path: str) -> list[tuple[int, str, int | None]]:
    """A snapshot table's commits, oldest first: (version, operation, the wave it wrote or
    None for a commit that is no wave)."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history().select("version", "operation", "userMetadata").collect()
    return sorted((int(h[0]), str(h[1]), _wave_number(h[2])) for h in history)


def _wave_number(user_metadata: str | None) -> int | None:
    note = user_metadata or ""
    return int(note.removeprefix(WAVE_METADATA)) if note.startswith(WAVE_METADATA) else None


def validate(spark: SparkSession, path: str, plan: SnapshotPlan, exact_count: bool) -> int:
    """The generation must hold exactly what the source's state held (one MVCC snapshot:
    the same count), or at least each key once (a source without a shared read view, or
    chunks each read in their own transaction)."""
    files_are_chunks = plan.key_unique_per_chunk and not _optimized_writes(spark)
    rows, nulls, distinct = _key_counts(spark, path, plan.schema.key, plan.table, files_are_chunks)
    if exact_count and rows != plan.source_rows:
        raise GenerationRejectedError(
            f"{plan.table}: the snapshot wrote {rows} rows but the source had {plan.source_rows} in the same "
            "snapshot; the generation is incomplete and is not used (take a new one: cdc-platform rehydrate "
            f"{plan.table})"
        )
    if nulls:  # the keys check fails on them; and a distinct count leaves them out
        raise GenerationRejectedError(
            f"{plan.table}: the snapshot holds {nulls} row(s) with a NULL in the key ({', '.join(plan.schema.key)}); "
            f"a key must never be NULL: set tables[{plan.table}].primary_key to columns that are never NULL (or "
            "fill the NULLs in the source); the generation is not used"
        )
    distinct = _distinct_keys(spark, path, plan.schema.key) if distinct is None else distinct
    if distinct != rows:
        raise GenerationRejectedError(
            f"{plan.table}: the snapshot holds {rows} rows but {distinct} distinct keys; the key "
            f"({', '.join(plan.schema.key)}) is not unique in the source: set tables[{plan.table}].primary_key to "
            "a unique key; the generation is not used"
        )
    return rows


def _optimized_writes(spark: SparkSession) -> bool:
    """Delta's optimized writes shuffle rows between tasks before writing: a file may then
    hold rows of several chunks (set by the user's spark.conf; the platform never does)."""
    return str(spark.conf.get("spark.databricks.delta.optimizeWrite.enabled", "false")).lower() == "true"


def _key_counts(
    spark: SparkSession, path: str, key: Sequence[str], table: str, unique_per_file: bool
) -> tuple[int, int, int | None]:
    """Rows, rows with a NULL in the key, and distinct keys when that takes no shuffle:
    ``key_proof`` shows the keys unique from the files (each a chunk, a key range), or
    None (the caller counts). ``unique_per_file``: the source's unique index already
    holds each file's keys distinct; then the files' statistics in the Delta log can show
    the rest (no NULLs, disjoint ranges) without Spark loading the table or reading a row."""
    from pyspark.sql import functions as F

    files = _file_statistics(path, key, table) if unique_per_file else None
    if files is not None and proven_unique(files):
        rows = sum(f.rows for f in files)
        log.info(f"{table}: {rows} keys shown unique from {len(files)} files' statistics (disjoint key ranges, each "
                 "file one read under the source's unique key)")  # fmt: skip
        return rows, 0, rows
    written = spark.read.format("delta").load(path)
    slices = slice_summaries(written, key)
    if slices is not None:
        rows, nulls = sum(s.rows for s in slices), sum(s.nulls for s in slices)
        proven = proven_unique(slices)
        log.info(f"{table}: {rows} keys {'shown unique' if proven else 'not shown unique'} from {len(slices)} file "
                 f"slice(s){'' if proven else '; counting distinct keys'}")  # fmt: skip
        return rows, nulls, rows if proven else None
    columns = [F.col(quote_spark(k)) for k in key]
    any_null = functools.reduce(lambda a, b: a | b, [k.isNull() for k in columns])
    counts = F.count(F.lit(1)).alias("n"), F.count(F.when(any_null, 1)).alias("nulls")
    stats = written.agg(*counts, F.count_distinct(*columns).alias("keys")).first()
    assert stats is not None
    return int(stats["n"]), int(stats["nulls"]), int(stats["keys"])


def _file_statistics(path: str, key: Sequence[str], table: str) -> list[SliceSummary] | None:
    """The Delta log's file statistics read by delta-rs; a table it cannot open (object
    storage it has no settings for) only loses the shortcut: the files are read instead."""
    try:
        return statistics_summaries(path, key)
    except Exception as exc:  # the shortcut only; validation reads the files instead
        log.info(f"{table}: the snapshot's file statistics were not read ({type(exc).__name__}); reading its keys")
        return None


def _distinct_keys(spark: SparkSession, path: str, key: Sequence[str]) -> int:
    from pyspark.sql import functions as F

    written = spark.read.format("delta").load(path)  # Delta keeps the state cached: this only lists the log again
    stats = written.agg(F.count_distinct(*[F.col(quote_spark(k)) for k in key]).alias("keys")).first()
    assert stats is not None
    return int(stats["keys"])


def read_plan(spark: SparkSession, plan: SnapshotPlan) -> DataFrame:
    """The plan's JDBC read as a frame of lake types."""
    types = {c.name: lake_type(c.pgtype, c.typmod, c.dims) for c in plan.schema.columns}
    return read_jdbc(spark, plan.read, types)


def read_jdbc(spark: SparkSession, read: JdbcRead, types: dict[str, Any]) -> DataFrame:
    properties = {
        "user": read.user,
        "password": read.password.get_secret_value(),
        "driver": read.driver,
        **read.options,
    }
    raw = spark.read.jdbc(url=read.url, table=read.source_sql, predicates=list(read.predicates), properties=properties)
    return as_lake_columns(raw, read, types)


def as_lake_columns(raw: DataFrame, read: JdbcRead, types: dict[str, Any]) -> DataFrame:
    """The lake's columns from a frame of the read's result columns (``read.columns``)."""
    return raw.select(*[_convert(c.name, c.conversion, types[c.name], c.source) for c in read.columns])


def _convert(name: str, conversion: str, lake: Any, source: str = "") -> Any:
    """Column ``name`` of the lake from the read's column ``source`` (or ``name``)."""
    from pyspark.sql import functions as F

    column = F.col(quote_spark(source or name))
    if conversion == "json_array":
        # from_json gives NULL for an array of another depth than the lake type (PostgreSQL
        # does not enforce declared dimensions): refuse the read, never write the NULL
        parsed = F.from_json(column, lake)
        converted = F.when(column.isNotNull() & parsed.isNull(), F.raise_error(F.lit(_depth_refusal(name)))).otherwise(
            parsed
        )
    elif conversion == "hex":
        converted = F.unhex(column)
    elif conversion == "utc_text":
        converted = F.concat(column, F.lit("Z")).cast(lake)  # the session ran in UTC
    elif conversion == "nonzero":
        converted = (column.cast("long") != 0).cast(lake)
    elif conversion == "unix_date":  # proleptic Gregorian days: no calendar conversion on the way
        converted = F.date_from_unix_date(column.cast("int"))
    elif conversion == "unix_micros":  # the session runs in UTC, so timestamp_ntz keeps the wall clock
        converted = F.timestamp_micros(column.cast("long")).cast(lake)
    else:
        converted = column.cast(lake)
    return converted.alias(name)


def _depth_refusal(name: str) -> str:
    return (
        f"{VALUE_REFUSED}: column {name!r} holds an array with other dimensions than the column declares, "
        "and the lake's type follows the declaration. Fix: declare the dimensions the values have "
        f"(ALTER TABLE … ALTER COLUMN {name} TYPE <element>[][]), or make the values match, then take "
        "a generation again (cdc-platform rehydrate); the changelog dead-letters such changes meanwhile"
    )


def table_bytes(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().select("sizeInBytes").first()
    return int(detail["sizeInBytes"]) if detail else 0


@contextmanager
def scratch_copy(
    spark: SparkSession, source: Source, kafka: KafkaClients, table: LakeTable, purpose: str
) -> Iterator[tuple[DataFrame, SnapshotPlan]]:
    """A consistent read of the source into a throwaway Delta table under the lake
    (``_scratch/``), removed afterwards: what checks and ``verify`` compare current with.
    Not a generation: the ledger never hears of it."""
    path = f"{table.lake_root.rstrip('/')}/_scratch/{purpose}-{uuid.uuid4().hex[:8]}"
    try:
        with (
            source.snapshot(table.config, kafka, table.topic) as plan,
            parquet_dictionary_off(spark, plan.distinct_columns),
        ):
            frame = read_plan(spark, plan)
            options = table_options(frame.schema, statistics_on=plan.schema.key)  # read whole, never pruned
            frame.write.format("delta").mode("overwrite").options(**options).save(path)
        yield spark.read.format("delta").load(path), plan
    finally:
        remove_path(spark, path)


def remove_path(spark: SparkSession, path: str) -> None:
    """Delete a lake directory: local paths directly, other URIs through Hadoop's FileSystem."""
    import shutil

    if "://" not in path or path.startswith("file:"):
        shutil.rmtree(path.removeprefix("file:"), ignore_errors=True)
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    target = jvm.org.apache.hadoop.fs.Path(path)
    target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(target, True)


class SparkProgress(threading.Thread):
    """Logs the running Spark job's progress (tasks done of tasks, and the share of the
    table that represents) every ``interval_s`` while a long read/write runs."""

    def __init__(
        self, spark: SparkSession, label: str, rows: int, log_progress: Callable[[str], None],
        interval_s: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.spark, self.label, self.rows, self.log_progress = spark, label, rows, log_progress
        self.interval_s = interval_s or PROGRESS_INTERVAL_S
        self._done = threading.Event()
        self.started_at = datetime.now(UTC)

    def __enter__(self) -> SparkProgress:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()

    def run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._done.wait(self.interval_s):
            total = done = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    total += info.numTasks
                    done += info.numCompletedTasks
            if total:
                share = done / total
                self.log_progress(
                    f"{self.label}: {done}/{total} Spark tasks done ({share:.0%}, ~{int(self.rows * share)} of "
                    f"{self.rows} rows)"
                )
