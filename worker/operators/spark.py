"""Spark stages: a vertex of parallelism 1 whose subtask drives Spark from its TaskExecutor slot.

A stage's inputs never pass through its driver subtask. Each named input is either written by
its upstream subtasks themselves, in parallel (``SparkStageInput``, chained onto them: one
Parquet file per subtask under ``<job storage>/intermediate/<stage uid>/in/<name>/``, renamed
into place when the subtask finishes, after which it sends the driver the file's URL), or, when
it is a Parquet source that nothing else reads, read by Spark straight from its files. At the
end of its input the driver (``SparkStage``) runs the user's function or SQL on the
TaskExecutor's SparkSession (``worker/spark.py``) over those files with all of Spark's
parallelism, writes the result as Parquet (up to four files a downstream subtask) into
``<attempt>/out``, and commits it by renaming that folder to ``<stage>/output``
(replacing what an earlier attempt committed: its downstream never read it, since a blocking
result is consumed only once its producer finished). Then it emits the committed files' paths;
``ParquetFilesReader``, the head of the downstream vertex, reads them as splits. A retried
stage reads the same input files again (its inputs are not rewritten) and never duplicates
rows. What Spark did (application id, jobs, stages, seconds) goes to
``<job storage>/spark/<uid>.json`` for ``yarnflow info``.

Errors: bad SQL or a failing function fail the subtask with ``SparkStageError``, one line that
names the stage and gives Spark's message (the JVM stack trace goes to the TaskExecutor's log)."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.operators.base import Operator

log = logging.getLogger(__name__)


class SparkStageError(YarnflowError):
    """A Spark stage failed: one line naming the stage and Spark's message."""

    #: the message says it all; the Python traceback of the task would only hide it
    show_traceback = False


class SparkStageInput(Operator):
    """One upstream subtask's share of a Spark stage's input ``view``: its rows, written as one
    Parquet file under ``<job storage>/intermediate/<stage uid>/in/<view>/`` while they come (a
    hidden name, ``_part-<subtask>-<attempt>.parquet``), renamed to ``part-<subtask>.parquet``
    when the subtask finishes (a retried subtask's file replaces the one its failed attempt may
    have left). Then it sends the stage's driver subtask the file's URL and row count: all the
    driver ever receives. So the stage's input is written in parallel, by as many subtasks as
    its upstream has, and read by Spark with all its parallelism."""

    kind = "spark_input"

    def __init__(self, stage_uid: str, view: str, name: str | None = None) -> None:
        super().__init__(name or f"{view} -> Spark")
        self.stage_uid = stage_uid
        self.view = view
        self._writer: tuple[Any, Any, str, str] | None = None
        self._rows = 0

    def _folder(self) -> str:
        return f"{self.ctx.job_storage_dir.rstrip('/')}/intermediate/{self.stage_uid}/in/{self.view}"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        if self._writer is None:
            fs, folder = fsspec.core.url_to_fs(self._folder())
            fs.makedirs(folder, exist_ok=True)
            index = self.ctx.subtask_index
            staged = f"{folder}/_part-{index:05d}-{self.ctx.attempt_id or self.ctx.attempt_number}.parquet"
            fh = fs.open(staged, "wb")
            self._writer = (fh, pq.ParquetWriter(fh, batch.schema), staged, f"{folder}/part-{index:05d}.parquet")
        self._writer[1].write_batch(batch)
        self._rows += batch.num_rows

    def finish(self) -> None:
        if self._writer is None:
            return  # no rows: no file (the driver reads the files that exist)
        fh, writer, staged, final = self._writer
        self._writer = None
        writer.close()
        fh.close()
        fs, _ = fsspec.core.url_to_fs(self._folder())
        if fs.exists(final):
            fs.rm(final)
        fs.mv(staged, final)
        self.output.collect(pa.record_batch({"path": pa.array([str(fs.unstrip_protocol(final))], pa.string()),
                                             "rows": pa.array([self._rows], pa.int64())}))

    def close(self) -> None:
        if self._writer is not None:  # failed or cancelled: the staged file goes
            fh, writer, staged, _ = self._writer
            self._writer = None
            try:
                writer.close()
                fh.close()
                fs, _ = fsspec.core.url_to_fs(self._folder())
                fs.rm(staged)
            except (OSError, pa.ArrowException):
                log.debug("removing the staged Spark input %s", staged, exc_info=True)


class SparkStage(Operator):
    """``fn(df) -> df`` over one input, or ``query`` over named inputs (temporary views).
    ``inputs``: the names of the inputs in input-index order. Each input arrives as the Parquet
    files its upstream subtasks wrote (``SparkStageInput``: a URL and a row count per file), or
    is read by Spark straight from its source files (``direct``: name -> path and columns, when
    the input is a Parquet source the pipeline does nothing else with). The driver subtask holds
    no rows. ``output_splits``: the downstream parallelism; the output is written as at most four
    times as many files as that, each a split for the readers (as many as Spark's last stage
    has partitions: adaptive execution sizes them from the data, so a small result may be fewer
    files than readers)."""

    kind = "spark"
    batch_only = True

    def __init__(self, inputs: list[str], fn: Callable[[Any], Any] | None = None, query: str | None = None,
                 output_splits: int = 1, name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name, uid or f"spark-{uuid.uuid4().hex[:12]}")
        if (fn is None) == (query is None):
            raise ValueError("a Spark stage runs either a function or a query")
        self.inputs = inputs
        self.fn = fn
        self.query = query
        self.output_splits = output_splits
        #: inputs Spark reads straight from their source files: name -> {"path": ..., "columns": ...}
        self.direct: dict[str, dict[str, Any]] = {}
        self._fs: Any = None
        self._root = ""
        self._attempt_dir = ""
        self._files: dict[int, list[str]] = {}
        self._rows = [0] * len(inputs)

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        base = self.ctx.job_storage_dir.rstrip("/")
        self._fs, root = fsspec.core.url_to_fs(f"{base}/intermediate/{self.uid}")
        self._root = root
        self._attempt_dir = f"{root}/attempt-{self.ctx.attempt_id or self.ctx.attempt_number}"
        for old in self._fs.glob(f"{root}/attempt-*"):  # what killed attempts left
            self._fs.rm(old, recursive=True)
        self._fs.makedirs(self._attempt_dir, exist_ok=True)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for path, rows in zip(batch.column("path").to_pylist(), batch.column("rows").to_pylist()):
            self._files.setdefault(input_index, []).append(path)
            self._rows[input_index] += rows

    def finish(self) -> None:
        from yarnflow.worker import spark as spark_runtime

        started = time.time()
        try:
            session = spark_runtime.stage_session(self.ctx.config)
        except Exception as exc:
            log.exception("Spark stage '%s': the SparkSession could not start", self.name)
            raise SparkStageError(f"Spark stage '{self.name}': the SparkSession could not start: "
                                  f"{spark_runtime.error_line(exc)}") from None
        sc = session.sparkContext
        group = f"yarnflow-{self.ctx.job_id}-{self.uid}-{self.ctx.attempt_number}"
        sc.setJobGroup(group, f"yarnflow {self.name}")
        out_dir = f"{self._attempt_dir}/out"
        try:
            frames = {name: self._read_input(session, i) for i, name in enumerate(self.inputs)}
            result = self._run(session, frames)
            # at most four files a downstream subtask (no shuffle: asking a DataFrame for its
            # partitions would run the query once more, adaptive execution plans from the data)
            result.coalesce(4 * self.output_splits).write.mode("overwrite").parquet(self._url(out_dir))
        except SparkStageError:
            raise
        except Exception as exc:
            log.exception("Spark stage '%s' failed", self.name)
            raise SparkStageError(f"Spark stage '{self.name}' failed: {spark_runtime.error_line(exc)}") from None
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        committed = f"{self._root}/output"
        if self._fs.exists(committed):
            self._fs.rm(committed, recursive=True)
        self._fs.mv(out_dir, committed, recursive=True)
        self._fs.rm(self._attempt_dir, recursive=True)
        files = sorted(p for p in self._fs.ls(committed, detail=False)
                       if p.rsplit("/", 1)[-1].startswith("part-") and p.endswith(".parquet"))
        self._report(session, group, time.time() - started, len(files))
        for path in files:  # one batch per file: the rebalancing exchange spreads them over the readers
            self.output.collect(pa.record_batch({"path": pa.array([self._url(path)], pa.string())}))

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, session: Any, frames: dict[str, Any]) -> Any:
        if self.query is not None:
            for name, frame in frames.items():
                frame.createOrReplaceTempView(name)
            return session.sql(self.query)
        assert self.fn is not None
        [frame] = frames.values()
        try:
            result = self.fn(frame)
        except Exception as exc:
            if _is_spark_error(exc):
                raise
            log.exception("Spark stage '%s': the user function raised", self.name)
            raise SparkStageError(f"Spark stage '{self.name}': user function "
                                  f"{getattr(self.fn, '__name__', self.fn)!s} raised {type(exc).__name__}: "
                                  f"{exc}") from None
        if not hasattr(result, "write") or not hasattr(result, "repartition"):
            raise SparkStageError(f"Spark stage '{self.name}': the function must return a Spark DataFrame, "
                                  f"not {type(result).__name__}")
        return result

    def _read_input(self, session: Any, index: int) -> Any:
        name = self.inputs[index]
        direct = self.direct.get(name)
        if direct is not None:
            from yarnflow.worker.operators.sources import expand_paths

            fs, files = expand_paths(direct["path"])
            frame = session.read.parquet(*[str(fs.unstrip_protocol(f)) for f in files])
            return frame.select(*direct["columns"]) if direct.get("columns") else frame
        if not self._files.get(index):  # no rows, so no schema: an empty frame without columns
            from pyspark.sql.types import StructType

            return session.createDataFrame([], StructType([]))
        return session.read.parquet(*self._files[index])

    def _url(self, path: str) -> str:
        return str(self._fs.unstrip_protocol(path))

    def _report(self, session: Any, group: str, seconds: float, files: int) -> None:
        sc = session.sparkContext
        tracker = sc.statusTracker()
        jobs = list(tracker.getJobIdsForGroup(group))
        stages = sorted({s for j in jobs if (info := tracker.getJobInfo(j)) is not None for s in info.stageIds})
        report = {"stage": self.name, "uid": self.uid, "application_id": sc.applicationId, "master": sc.master,
                  "jobs": len(jobs), "stages": len(stages), "seconds": round(seconds, 3), "output_files": files,
                  "input_rows": {n: ("read by Spark from its source files" if n in self.direct else r)
                               for n, r in zip(self.inputs, self._rows)}, "attempt": self.ctx.attempt_number,
                  "driver_pid": os.getpid()}
        base = self.ctx.job_storage_dir.rstrip("/")
        try:
            fs, path = fsspec.core.url_to_fs(f"{base}/spark/{self.uid}.json")
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(path, "w") as fh:
                json.dump(report, fh)
        except OSError:
            log.warning("could not write the report of Spark stage '%s'", self.name, exc_info=True)
        log.info("Spark stage '%s' done in %.2f s: application %s, %d jobs, %d stages, %d files", self.name,
                 seconds, sc.applicationId, len(jobs), len(stages), files)


def _is_spark_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("pyspark", "py4j"))


class ParquetFilesReader(Operator):
    """The head of a Spark stage's downstream: reads the Parquet files whose paths arrive
    (column ``path``) and emits their rows in batches of ``ctx.batch_size``."""

    kind = "read_spark_output"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for url in batch.column("path").to_pylist():
            fs, path = fsspec.core.url_to_fs(url)
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                for out in pf.iter_batches(batch_size=self.ctx.batch_size):
                    if out.num_rows:
                        self.output.collect(out)
