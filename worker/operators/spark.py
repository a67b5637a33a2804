"""Spark stages: a vertex of parallelism 1 whose subtask drives Spark from its TaskExecutor slot.

``SparkStage`` receives its inputs (one per named input; BATCH jobs only, so every input is a
finished blocking result) and writes each as Parquet under the job's intermediate folder
(``<job storage>/intermediate/<stage uid>/<attempt>/in/<name>/``). At the end of its input it
runs the user's function or SQL on the TaskExecutor's SparkSession (``worker/spark.py``) with
``spark.read.parquet`` over those folders, writes the result as Parquet split into as many
files as the downstream has subtasks into ``<attempt>/out``, and commits it by renaming that
folder to ``<stage>/output`` (replacing what an earlier attempt committed: its downstream never
read it, since a blocking result is consumed only once its producer finished). Then it emits
the committed files' paths; ``ParquetFilesReader``, the head of the downstream vertex, reads
them as splits. A retried stage therefore never duplicates rows. What Spark did (application
id, jobs, stages, seconds) goes to ``<job storage>/spark/<uid>.json`` for ``yarnflow info``.

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


class SparkStage(Operator):
    """``fn(df) -> df`` over one input, or ``query`` over named inputs (temporary views).
    ``inputs``: the names of the inputs in input-index order; ``output_splits``: the number of
    Parquet files the output is split into (the downstream parallelism)."""

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
        self._fs: Any = None
        self._root = ""
        self._attempt_dir = ""
        self._writers: dict[int, tuple[Any, Any]] = {}
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
        if batch.num_rows == 0:
            return
        entry = self._writers.get(input_index)
        if entry is None:
            path = f"{self._input_dir(input_index)}/part-0.parquet"
            self._fs.makedirs(self._input_dir(input_index), exist_ok=True)
            fh = self._fs.open(path, "wb")
            entry = (fh, pq.ParquetWriter(fh, batch.schema))
            self._writers[input_index] = entry
        entry[1].write_batch(batch)
        self._rows[input_index] += batch.num_rows

    def finish(self) -> None:
        self._close_writers()
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
            result.repartition(self.output_splits).write.mode("overwrite").parquet(self._url(out_dir))
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

    def close(self) -> None:
        self._close_writers()

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
        if self._rows[index] == 0:  # no rows, so no schema: an empty frame without columns
            from pyspark.sql.types import StructType

            return session.createDataFrame([], StructType([]))
        return session.read.parquet(self._url(self._input_dir(index)))

    def _input_dir(self, index: int) -> str:
        return f"{self._attempt_dir}/in/{self.inputs[index]}"

    def _url(self, path: str) -> str:
        return str(self._fs.unstrip_protocol(path))

    def _close_writers(self) -> None:
        writers, self._writers = self._writers, {}
        for fh, writer in writers.values():
            writer.close()
            fh.close()

    def _report(self, session: Any, group: str, seconds: float, files: int) -> None:
        sc = session.sparkContext
        tracker = sc.statusTracker()
        jobs = list(tracker.getJobIdsForGroup(group))
        stages = sorted({s for j in jobs if (info := tracker.getJobInfo(j)) is not None for s in info.stageIds})
        report = {"stage": self.name, "uid": self.uid, "application_id": sc.applicationId, "master": sc.master,
                  "jobs": len(jobs), "stages": len(stages), "seconds": round(seconds, 3), "output_files": files,
                  "input_rows": dict(zip(self.inputs, self._rows)), "attempt": self.ctx.attempt_number,
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
