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
from yarnflow.worker.state.tables import Snapshot, require_columns

log = logging.getLogger(__name__)


class SparkStageError(YarnflowError):
    """A Spark stage failed: one line naming the stage and Spark's message."""

    #: the message says it all; the Python traceback of the task would only hide it
    show_traceback = False


class SparkStageInput(Operator):
    """One upstream subtask's share of a Spark stage's input ``view``, written as Parquet under
    ``<job storage>/intermediate/<stage uid>/in/<view>/`` while its rows come; the stage's
    driver subtask gets only the files' URLs and row counts. So the stage's input is written in
    parallel, by as many subtasks as its upstream has, and read by Spark with all its
    parallelism.

    BATCH: one file, under a hidden name (``_part-<subtask>-<attempt>.parquet``) renamed to
    ``part-<subtask>.parquet`` when the subtask finishes (a retried subtask's file replaces what
    its failed attempt may have left), then its URL goes to the driver. STREAMING: one file per
    checkpoint span (``stream/<attempt>-<subtask>-<n>.parquet``), closed and its URL sent when a
    checkpoint is taken, before the barrier (``prepare_snapshot_pre_barrier``), so the driver
    receives a span's files before that checkpoint's barrier; a file of a failed attempt after
    its last checkpoint is never named, and the restored upstream writes its rows anew."""

    kind = "spark_input"

    def __init__(self, stage_uid: str, view: str, name: str | None = None) -> None:
        super().__init__(name or f"{view} -> Spark")
        self.stage_uid = stage_uid
        self.view = view
        self._writer: tuple[Any, Any, str, str] | None = None
        self._rows = 0
        self._seq = 0

    def _folder(self) -> str:
        return f"{self.ctx.job_storage_dir.rstrip('/')}/intermediate/{self.stage_uid}/in/{self.view}"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        if self._writer is None:
            fs, folder = fsspec.core.url_to_fs(self._folder())
            index, attempt = self.ctx.subtask_index, self.ctx.attempt_id or self.ctx.attempt_number
            if self.ctx.is_batch:
                fs.makedirs(folder, exist_ok=True)
                staged, final = f"{folder}/_part-{index:05d}-{attempt}.parquet", f"{folder}/part-{index:05d}.parquet"
            else:
                fs.makedirs(f"{folder}/stream", exist_ok=True)
                staged = final = f"{folder}/stream/{attempt}-{index:05d}-{self._seq}.parquet"
                self._seq += 1
            fh = fs.open(staged, "wb")
            self._writer = (fh, pq.ParquetWriter(fh, batch.schema), staged, final)
            self._rows = 0
        self._writer[1].write_batch(batch)
        self._rows += batch.num_rows

    def _send(self) -> None:
        """Close the file being written, put it in place and send its URL to the driver."""
        if self._writer is None:
            return  # no rows since the last one: no file (the driver reads the files that exist)
        fh, writer, staged, final = self._writer
        self._writer = None
        writer.close()
        fh.close()
        fs, _ = fsspec.core.url_to_fs(self._folder())
        if staged != final:
            if fs.exists(final):
                fs.rm(final)
            fs.mv(staged, final)
        self.output.collect(pa.record_batch({"path": pa.array([str(fs.unstrip_protocol(final))], pa.string()),
                                             "rows": pa.array([self._rows], pa.int64())}))

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._send()  # the span's file goes to the driver before the checkpoint's barrier

    def finish(self) -> None:
        self._send()

    def close(self) -> None:
        if self._writer is not None:  # failed or cancelled: the file being written goes
            fh, writer, staged, _ = self._writer
            self._writer = None
            try:
                writer.close()
                fh.close()
                fs, _ = fsspec.core.url_to_fs(self._folder())
                fs.rm(staged)
            except (OSError, pa.ArrowException):
                log.debug("removing the unfinished Spark input %s", staged, exc_info=True)


class SparkStage(Operator):
    """``fn(df) -> df`` over one input, or ``query`` over named inputs (temporary views).
    ``inputs``: the names of the inputs in input-index order. Each input arrives as the Parquet
    files its upstream subtasks wrote (``SparkStageInput``: a URL and a row count per file), or
    is read by Spark straight from its source files (``direct``: name -> path and columns, when
    the input is a Parquet source the pipeline does nothing else with). The driver subtask holds
    no rows. ``output_splits``: the downstream parallelism; the output is written as at most four
    times as many files as that, each a split for the readers (as many as Spark's last stage
    has partitions: adaptive execution sizes them from the data, so a small result may be fewer
    files than readers).

    STREAMING (checkpoints on): a micro-batch per checkpoint, as Spark's ``foreachBatch``. The
    files that arrive before checkpoint n's barrier are epoch n, kept in the operator's state
    (table ``epochs``: epoch, input, path; table ``schemas``: each input's Arrow schema, for an
    epoch without rows of it). When checkpoint n completes, every epoch up to n not run yet runs
    (in order), its output written to ``out/epoch-<n>/`` (replaced if a restored attempt runs it
    again) and its file names emitted downstream: they belong to the checkpoint after n, and an
    epoch is marked run only in the next snapshot, so a failure before that checkpoint runs the
    epoch again from its kept inputs, and the downstream, restored to n, reads its output once.
    An epoch's input and output files are deleted once a checkpoint after its run completes. At
    the end of a bounded input the epochs left and the last files run at once."""

    kind = "spark"

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
        self._epochs: dict[int, dict[int, list[str]]] = {}  # STREAMING: checkpoint -> input -> files, not run
        self._schemas: dict[int, bytes] = {}  # STREAMING: each input's Arrow schema (IPC bytes)
        self._ran: list[tuple[int, list[str]]] = []  # (last snapshot before the run, files to delete)
        self._last_snapshot = 0
        self._micro_batches = 0
        self._holding = False  # the AppMaster's Spark cluster is held for this stage

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        base = self.ctx.job_storage_dir.rstrip("/")
        self._fs, root = fsspec.core.url_to_fs(f"{base}/intermediate/{self.uid}")
        self._root = root
        self._attempt_dir = f"{root}/attempt-{self.ctx.attempt_id or self.ctx.attempt_number}"
        if not self.ctx.is_batch:
            return
        for old in self._fs.glob(f"{root}/attempt-*"):  # what killed attempts left
            self._fs.rm(old, recursive=True)
        self._fs.makedirs(self._attempt_dir, exist_ok=True)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for path, rows in zip(batch.column("path").to_pylist(), batch.column("rows").to_pylist()):
            self._files.setdefault(input_index, []).append(path)
            self._rows[input_index] += rows
            if not self.ctx.is_batch and input_index not in self._schemas:
                self._schemas[input_index] = _schema_of(path).serialize().to_pybytes()

    def finish(self) -> None:
        if not self.ctx.is_batch:  # the end of a bounded STREAMING input: what is left runs now
            if self._files:
                self._epochs[max([self._last_snapshot, *self._epochs]) + 1] = self._files
                self._files = {}
            self._run_epochs(None)
            return
        session, group, started = self._session()
        out_dir = f"{self._attempt_dir}/out"
        try:
            self._write(session, self._files, out_dir)
        finally:
            self._done()
        committed = f"{self._root}/output"
        if self._fs.exists(committed):
            self._fs.rm(committed, recursive=True)
        self._fs.mv(out_dir, committed, recursive=True)
        self._fs.rm(self._attempt_dir, recursive=True)
        files = self._emit(committed)
        self._report(session, group, time.time() - started, len(files), inputs=self._files)

    # -- STREAMING: micro-batches ---------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        if self.ctx.is_batch:
            return {}
        if self._files:
            self._epochs[checkpoint_id] = self._files
            self._files = {}
        self._last_snapshot = checkpoint_id
        rows = [(e, i, p) for e, by_input in sorted(self._epochs.items()) for i, ps in by_input.items() for p in ps]
        return {"epochs": pa.table({"epoch": pa.array([r[0] for r in rows], pa.int64()),
                                    "input": pa.array([r[1] for r in rows], pa.int32()),
                                    "path": pa.array([r[2] for r in rows], pa.string())}),
                "schemas": pa.table({"input": pa.array(list(self._schemas), pa.int32()),
                                     "schema": pa.array(list(self._schemas.values()), pa.binary())})}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        epochs = state.get("epochs")
        if epochs is not None:
            require_columns(epochs, "epochs", ["epoch", "input", "path"])
            for e, i, p in zip(*(epochs.column(c).to_pylist() for c in ("epoch", "input", "path"))):
                self._epochs.setdefault(e, {}).setdefault(i, []).append(p)
        schemas = state.get("schemas")
        if schemas is not None:
            require_columns(schemas, "schemas", ["input", "schema"])
            self._schemas = dict(zip(schemas.column("input").to_pylist(), schemas.column("schema").to_pylist()))
        self._last_snapshot = self.ctx.restored_checkpoint_id
        if self._epochs:
            log.info("Spark stage '%s' restored %d epochs not run yet: %s", self.name, len(self._epochs),
                     sorted(self._epochs))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.ctx.is_batch:
            return
        done = [(before, files) for before, files in self._ran if before < checkpoint_id]
        self._ran = [(before, files) for before, files in self._ran if before >= checkpoint_id]
        for _, files in done:  # run before this checkpoint's barrier: their output is in it
            for path in files:
                try:
                    self._fs.rm(path, recursive=True)
                except FileNotFoundError:
                    pass
        self._run_epochs(checkpoint_id)

    def _run_epochs(self, up_to: int | None) -> None:
        """Run every epoch not run yet (up to checkpoint ``up_to``), oldest first."""
        for epoch in sorted(e for e in self._epochs if up_to is None or e <= up_to):
            files = self._epochs.pop(epoch)
            if not any(files.values()):
                continue
            session, group, started = self._session()
            out_dir = f"{self._root}/out/epoch-{epoch}"
            try:
                self._write(session, files, out_dir)
            finally:
                self._done()
            emitted = self._emit(out_dir)
            self._report(session, group, time.time() - started, len(emitted), epoch, inputs=files)
            inputs = [fsspec.core.url_to_fs(p)[1] for ps in files.values() for p in ps]
            self._ran.append((self._last_snapshot, [*inputs, out_dir]))

    # -- running Spark ----------------------------------------------------------------------------
    def _session(self) -> tuple[Any, str, float]:
        """The stage's SparkSession, and its job group and start time. When the AppMaster's
        Spark cluster runs it, the cluster is held until ``_done`` (call it whatever happens)."""
        from yarnflow.worker import spark as spark_runtime

        started = time.time()
        try:
            master = spark_runtime.resolve_master(self.ctx.config, self.ctx.spark_master)
            self._holding = master.startswith("spark://")
            session = spark_runtime.stage_session(self.ctx.config, master)
        except Exception as exc:
            self._done()
            log.exception("Spark stage '%s': the SparkSession could not start", self.name)
            raise SparkStageError(f"Spark stage '{self.name}': the SparkSession could not start: "
                                  f"{spark_runtime.error_line(exc)}") from None
        group = f"yarnflow-{self.ctx.job_id}-{self.uid}-{self.ctx.attempt_number}"
        session.sparkContext.setJobGroup(group, f"yarnflow {self.name}")
        return session, group, started

    def _done(self) -> None:
        """Spark's work for now is done: let the AppMaster's Spark cluster go idle."""
        if self._holding and self.ctx.spark_master is not None:
            self._holding = False
            self.ctx.spark_master.release()

    def _write(self, session: Any, files: dict[int, list[str]], out_dir: str) -> None:
        """Run the stage over ``files`` (by input) and write its result as Parquet to ``out_dir``."""
        from yarnflow.worker import spark as spark_runtime

        try:
            frames = {name: self._read_input(session, i, files.get(i, [])) for i, name in enumerate(self.inputs)}
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
            session.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def _emit(self, folder: str) -> list[str]:
        """Send the URLs of the Parquet files in ``folder`` downstream, one batch each (the
        rebalancing exchange spreads them over the readers)."""
        files = sorted(p for p in self._fs.ls(folder, detail=False)
                       if p.rsplit("/", 1)[-1].startswith("part-") and p.endswith(".parquet"))
        for path in files:
            self.output.collect(pa.record_batch({"path": pa.array([self._url(path)], pa.string())}))
        return files

    def close(self) -> None:
        self._done()

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

    def _read_input(self, session: Any, index: int, files: list[str]) -> Any:
        name = self.inputs[index]
        direct = self.direct.get(name)
        if direct is not None:
            from yarnflow.worker.operators.sources import expand_paths

            fs, paths = expand_paths(direct["path"])
            frame = session.read.parquet(*[str(fs.unstrip_protocol(f)) for f in paths])
            return frame.select(*direct["columns"]) if direct.get("columns") else frame
        if files:
            return session.read.parquet(*files)
        schema = self._schemas.get(index)
        if schema is not None:  # an epoch without rows of this input: empty, with its columns
            empty = f"{self._root}/empty/{index}.parquet"
            self._fs.makedirs(f"{self._root}/empty", exist_ok=True)
            with self._fs.open(empty, "wb") as fh:
                pq.write_table(pa.ipc.read_schema(pa.py_buffer(schema)).empty_table(), fh)
            return session.read.parquet(self._url(empty))
        from pyspark.sql.types import StructType  # no rows ever, so no schema: no columns

        return session.createDataFrame([], StructType([]))

    def _url(self, path: str) -> str:
        return str(self._fs.unstrip_protocol(path))

    def _report(self, session: Any, group: str, seconds: float, files: int, epoch: int | None = None,
                inputs: dict[int, list[str]] | None = None) -> None:
        sc = session.sparkContext
        tracker = sc.statusTracker()
        jobs = list(tracker.getJobIdsForGroup(group))
        stages = sorted({s for j in jobs if (info := tracker.getJobInfo(j)) is not None for s in info.stageIds})
        try:  # the executors the application holds (the driver is listed too, locally it is all there is)
            executors = max(0, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)
        except Exception:  # noqa: BLE001 - a report without it
            executors = -1
        report = {"stage": self.name, "uid": self.uid, "application_id": sc.applicationId, "master": sc.master,
                  "executors": executors,
                  "jobs": len(jobs), "stages": len(stages), "seconds": round(seconds, 3), "output_files": files,
                  "input_rows": {n: ("read by Spark from its source files" if n in self.direct else r)
                               for n, r in zip(self.inputs, self._rows)},
                  # the files the upstream subtasks wrote for this run, per input (one a writer)
                  "input_files": {n: len((inputs or {}).get(i, [])) for i, n in enumerate(self.inputs)
                                  if n not in self.direct},
                  "attempt": self.ctx.attempt_number,
                  "driver_pid": os.getpid()}
        if epoch is not None:  # STREAMING: the latest micro-batch, and how many ran so far
            self._micro_batches += 1
            report.update({"epoch": epoch, "micro_batches": self._micro_batches})
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


def _schema_of(url: str) -> pa.Schema:
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as fh:
        return pq.read_schema(fh)


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
