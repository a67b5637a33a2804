"""A task's side of checkpoints, outside its operator loop: the mailbox through which the
TaskExecutor hands it checkpoint calls, the background writer of its snapshots, and the reading
of its state on restore.

- ``Mailbox``: thread-safe; the TaskExecutor puts ``TriggerCheckpoint`` / ``NotifyCheckpoint``
  mails in, the task thread takes them out between two elements (so operator hooks run on the
  task thread). Putting a mail wakes the task (``on_mail``) when it waits for input.
- ``SnapshotWriter``: on a thread of its own, makes the tables of each operator's snapshot (an
  ``AsyncSnapshot`` is built there: the task only froze its state) and writes each as an Arrow
  IPC file under ``<checkpoint dir>/chk-<n>/<vertex>-<subtask>-<attempt>/op<i>-<name>.arrow``
  (any fsspec URL), then acknowledges the checkpoint to the JobMaster; any error declines it
  instead. Snapshots are made and written in the order they were taken. A RocksDB backend's
  snapshot (``NativeSnapshot``) uploads its SST files itself, into ``<checkpoint dir>/shared/``
  when checkpoints are incremental; each shared file it references is acknowledged as a state
  file named ``SHARED_FILE`` (the JobMaster counts references to it).
- ``read_task_state``: the tables of a ``TaskRestore``, per operator index; a file that cannot
  be read raises ``StateRestoreError`` naming it. A subtask restored at another parallelism may
  get one table of a name from several old subtasks: they are concatenated (keyed operators
  keep the rows of their own key groups; operator state such as held splits is a list).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Union

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc

from yarnflow.common.errors import YarnflowError
from yarnflow.common.messages import OperatorStateFile, TaskRestore, TaskStateSnapshot
from yarnflow.worker.state.local_recovery import TaskLocalState, local_copy, record_read
from yarnflow.worker.state.rocksdb_files import SHARED_FILE, NativeSnapshot
from yarnflow.worker.state.tables import AsyncSnapshot, Snapshot

log = logging.getLogger(__name__)


class StateRestoreError(YarnflowError, IOError):
    """A state file of the checkpoint a task restores from cannot be read; the message names it."""


# -- mailbox ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TriggerCheckpoint:
    checkpoint_id: int
    timestamp_ms: int
    exactly_once: bool
    stop: str = ""  # "stop" / "drain": the savepoint of stop-with-savepoint (see stream_task)
    aligned_timeout_ms: int = -1  # unaligned checkpoints (see CheckpointBarrier)


@dataclass(frozen=True)
class NotifyCheckpoint:
    checkpoint_id: int
    complete: bool  # False: aborted


Mail = Union[TriggerCheckpoint, NotifyCheckpoint]


class Mailbox:
    """Checkpoint calls for one task, in the order they came."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._mails: collections.deque[Mail] = collections.deque()
        self.on_mail: Callable[[], None] = lambda: None

    def put(self, mail: Mail) -> None:
        with self._lock:
            self._mails.append(mail)
            self._arrived.notify_all()
        self.on_mail()

    def wait(self, timeout_s: float) -> bool:
        """Block until there is mail (True) or ``timeout_s`` passed (False)."""
        with self._lock:
            return self._arrived.wait_for(lambda: bool(self._mails), timeout_s)

    def __bool__(self) -> bool:
        return bool(self._mails)

    def drain(self) -> list[Mail]:
        with self._lock:
            mails = list(self._mails)
            self._mails.clear()
        return mails


# -- writing ----------------------------------------------------------------------------------

class CheckpointResponder(Protocol):
    """Where a task's answer to a checkpoint goes (its JobMaster). Errors are the caller's to log."""

    def acknowledge(self, checkpoint_id: int, snapshot: TaskStateSnapshot) -> None: ...

    def decline(self, checkpoint_id: int, reason: str) -> None: ...


def state_dir(checkpoint_dir: str, checkpoint_id: int, vertex_id: str, subtask_index: int,
              attempt_number: int) -> str:
    return f"{checkpoint_dir.rstrip('/')}/chk-{checkpoint_id}/{vertex_id}-{subtask_index}-{attempt_number}"


class SnapshotWriter:
    """Writes a task's snapshots in the background and answers the JobMaster; never raises
    into the task (a failed acknowledgement or decline is logged)."""

    def __init__(self, checkpoint_dir: str, vertex_id: str, subtask_index: int, attempt_number: int,
                 responder: CheckpointResponder, name: str, local_state: TaskLocalState | None = None) -> None:
        """``local_state``: task-local recovery keeps a copy of every file written there."""
        self._dir = checkpoint_dir
        self._local = local_state
        self._vertex_id = vertex_id
        self._subtask_index = subtask_index
        self._attempt_number = attempt_number
        self._responder = responder
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def submit(self, checkpoint_id: int, snapshots: list[Snapshot], alignment_ms: int,
               sync_ms: int, channel_state: dict[str, list[Any]] | None = None, start_delay_ms: int = 0) -> None:
        """Write ``snapshots`` (one per operator of the chain, head first) and, for an
        unaligned checkpoint, the in-flight data (``channel_state``), and acknowledge."""
        if self._closed:
            release_all(snapshots)
        else:
            self._background().submit(self._write, checkpoint_id, snapshots, alignment_ms, sync_ms, channel_state,
                                      start_delay_ms)

    def decline(self, checkpoint_id: int, reason: str) -> None:
        """Decline ``checkpoint_id`` (in the background, after the answers before it)."""
        if self._closed:
            self._decline_now(checkpoint_id, reason)
        else:
            self._background().submit(self._decline_now, checkpoint_id, reason)

    def _background(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-writer {self._name}")
        return self._pool

    def _decline_now(self, checkpoint_id: int, reason: str) -> None:
        log.info("%s declines checkpoint %d: %s", self._name, checkpoint_id, reason)
        try:
            self._responder.decline(checkpoint_id, reason)
        except Exception as exc:  # noqa: BLE001 - never fails the task
            log.warning("%s: declining checkpoint %d failed: %s", self._name, checkpoint_id, exc)

    def checkpoint_ended(self, checkpoint_id: int, complete: bool) -> None:
        """The JobMaster said the checkpoint completed or was aborted: the local copies of the
        earlier ones (or of this one) go, after the writes before this (task-local recovery)."""
        local = self._local
        if local is None or self._closed:
            return
        self._background().submit(local.confirmed if complete else local.aborted, checkpoint_id)

    def close(self, wait: bool) -> None:
        """Stop taking snapshots; ``wait``: until the ones taken are written and answered."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=wait)

    def _write(self, checkpoint_id: int, snapshots: list[Snapshot], alignment_ms: int,
               sync_ms: int, channel_state: dict[str, list[Any]] | None = None, start_delay_ms: int = 0) -> None:
        started = time.monotonic()
        inflight_bytes = 0
        try:
            files = self.write_files(checkpoint_id, snapshots)
            if channel_state is not None:
                channel_files, inflight_bytes = self._write_channel_state(checkpoint_id, channel_state)
                files += channel_files
        except Exception as exc:  # noqa: BLE001 - any failure declines the checkpoint
            log.debug("%s: writing checkpoint %d failed", self._name, checkpoint_id, exc_info=True)
            self._decline_now(checkpoint_id, f"writing the state of {self._name} failed: {type(exc).__name__}: {exc}")
            return
        async_ms = int(round((time.monotonic() - started) * 1000))
        snapshot = TaskStateSnapshot(files, alignment_ms, sync_ms, async_ms, channel_state is not None, inflight_bytes,
                                     start_delay_ms)
        try:
            self._responder.acknowledge(checkpoint_id, snapshot)
        except Exception as exc:  # noqa: BLE001 - never fails the task
            log.warning("%s: acknowledging checkpoint %d failed: %s", self._name, checkpoint_id, exc)
            return
        log.debug("%s acknowledged checkpoint %d (%d files, %d bytes)", self._name, checkpoint_id, len(files),
                  snapshot.size_bytes)

    def write_files(self, checkpoint_id: int, snapshots: list[Snapshot]) -> list[OperatorStateFile]:
        """Make the tables of ``snapshots`` (releasing each AsyncSnapshot once made) and write
        them; returns the files."""
        folder = state_dir(self._dir, checkpoint_id, self._vertex_id, self._subtask_index, self._attempt_number)
        files = []
        try:
            made = []
            for index, s in enumerate(snapshots):
                if isinstance(s, NativeSnapshot):  # a RocksDB backend's files (see rocksdb_files.py)
                    if not self._dir:
                        raise YarnflowError("the task has state to write but no checkpoint dir")
                    keep = functools.partial(self._keep_sst, checkpoint_id) if self._local is not None else None
                    tables, shared = s.write_native(f"{self._dir.rstrip('/')}/shared", folder, keep)
                    files += [OperatorStateFile(index, SHARED_FILE, url, size) for url, size in shared]
                    made.append(check_tables(s, tables))
                else:
                    made.append(_tables(s))
        finally:
            release_all(snapshots)
        if not any(made):
            return files
        if not self._dir:
            raise YarnflowError("the task has state to write but no checkpoint dir")
        fs, root = fsspec.core.url_to_fs(folder)
        fs.makedirs(root, exist_ok=True)
        for index, tables in enumerate(made):
            for name, table in tables.items():
                url = f"{folder}/op{index}-{name}.arrow"
                size = self._write_table(checkpoint_id, fs, f"{root}/op{index}-{name}.arrow", url, table)
                files.append(OperatorStateFile(index, name, url, size))
        return files

    def _keep_sst(self, checkpoint_id: int, url: str, path: str, sha256: str) -> None:
        """Task-local recovery: keep a hard link of a RocksDB snapshot's SST file (immutable)."""
        assert self._local is not None
        self._local.keep(checkpoint_id, url, path, link=True, sha256=sha256)

    def _write_table(self, checkpoint_id: int, fs: Any, path: str, url: str, table: pa.Table) -> int:
        """Write ``table`` as an Arrow IPC file at ``path`` on ``fs`` (``url``); with task-local
        recovery it is written locally first, uploaded, and kept. Returns its size."""
        if self._local is None:
            with fs.open(path, "wb") as fh:
                with ipc.new_file(fh, table.schema) as writer:
                    writer.write_table(table)
                return int(fh.tell())
        local = self._local.temp_file()
        with ipc.new_file(local, table.schema) as writer:
            writer.write_table(table)
        size = os.path.getsize(local)
        fs.put_file(local, path)
        self._local.keep_written(checkpoint_id, url, local)
        return size


    def _write_channel_state(self, checkpoint_id: int, state: dict[str, list[Any]]
                             ) -> tuple[list[OperatorStateFile], int]:
        """One file per channel with in-flight data (``@in-<channel>``, ``@out-<writer>-<i>``):
        a row per element, in order; returns the files and the bytes of their batches."""
        if not state:
            return [], 0
        if not self._dir:
            raise YarnflowError("the task has in-flight data to write but no checkpoint dir")
        folder = state_dir(self._dir, checkpoint_id, self._vertex_id, self._subtask_index, self._attempt_number)
        fs, root = fsspec.core.url_to_fs(folder)
        fs.makedirs(root, exist_ok=True)
        files, total = [], 0
        for name, elements in state.items():
            table, nbytes = encode_channel_state(elements)
            total += nbytes
            size = self._write_table(checkpoint_id, fs, f"{root}/{name}.arrow", f"{folder}/{name}.arrow", table)
            files.append(OperatorStateFile(0, name, f"{folder}/{name}.arrow", size))
        return files, total


#: a channel's in-flight data: a row per element (``kind`` "b": a record batch as an Arrow IPC
#: stream, "e": an event as the exchange encodes it)
CHANNEL_STATE_SCHEMA = pa.schema([("kind", pa.string()), ("payload", pa.binary())])


def is_channel_state(name: str) -> bool:
    return name.startswith(("@in-", "@out-", "@rin-", "@rout-"))


@dataclass
class ChannelState:
    """The in-flight data a task restores. ``inputs`` / ``outputs``: its own, per input channel
    and per ``(writer, subpartition)`` (a restore at the parallelism it was taken at). From a
    checkpoint rescaled through a savepoint (``@rin-<input>-<old subtask>-<channel>``,
    ``@rout-<writer>-<old subtask>-<i>``, dealt by ``am/checkpoint/savepoints.py``): the rows
    other subtasks had in flight, per vertex input (``rescaled_inputs``: this task keeps those
    of its key groups when the input is keyed) and per writer (``rescaled_outputs``: sent again
    through the writer's partitioner); their watermarks are left out (each channel's event time
    starts again from what its producer sends next)."""

    inputs: dict[int, list[Any]] = field(default_factory=dict)
    outputs: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    rescaled_inputs: dict[int, list[pa.RecordBatch]] = field(default_factory=dict)
    rescaled_outputs: dict[int, list[pa.RecordBatch]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs or self.rescaled_inputs or self.rescaled_outputs)


def encode_channel_state(elements: list[Any]) -> tuple[pa.Table, int]:
    from yarnflow.worker.elements import encode_event

    kinds, payloads, nbytes = [], [], 0
    for element in elements:
        if isinstance(element, pa.RecordBatch):
            sink = pa.BufferOutputStream()
            with ipc.new_stream(sink, element.schema) as writer:
                writer.write_batch(element)
            kinds.append("b")
            payloads.append(sink.getvalue().to_pybytes())
            nbytes += element.nbytes
        else:
            kinds.append("e")
            payloads.append(encode_event(element))
    return pa.table({"kind": kinds, "payload": payloads}, schema=CHANNEL_STATE_SCHEMA), nbytes


def decode_channel_state(table: pa.Table) -> list[Any]:
    from yarnflow.worker.elements import decode_event

    out: list[Any] = []
    for kind, payload in zip(table.column("kind").to_pylist(), table.column("payload").to_pylist()):
        if kind == "b":
            out.extend(ipc.open_stream(pa.py_buffer(payload)))
        else:
            out.append(decode_event(payload))
    return out


def read_channel_state(restore: TaskRestore) -> ChannelState:
    """The in-flight data a restored unaligned checkpoint holds (see ``ChannelState``)."""
    state = ChannelState()
    for f in sorted(restore.files, key=lambda f: f.name):
        if not is_channel_state(f.name):
            continue
        try:
            elements = decode_channel_state(_read_state_file(f.path, f.size_bytes))
            kind, _, rest = f.name[1:].partition("-")
            parts = [int(p) for p in rest.split("-")]
            if kind == "in":  # @in-<input>-<channel> (or, written before, @in-<channel>)
                state.inputs[parts[-1]] = elements
            elif kind == "out":
                state.outputs[(parts[0], parts[1])] = elements
            else:
                batches = [e for e in elements if isinstance(e, pa.RecordBatch)]
                target = state.rescaled_inputs if kind == "rin" else state.rescaled_outputs
                target.setdefault(parts[0], []).extend(batches)
        except Exception as exc:  # noqa: BLE001 - any failure names the file
            raise StateRestoreError(f"checkpoint {restore.checkpoint_id}: cannot read in-flight data {f.path}: "
                                    f"{type(exc).__name__}: {exc}") from exc
    return state


def release_all(snapshots: list[Snapshot]) -> None:
    """Release the AsyncSnapshots among ``snapshots`` (taken, but not to be written)."""
    for snapshot in snapshots:
        if isinstance(snapshot, AsyncSnapshot):
            try:
                snapshot.release()
            except Exception:  # noqa: BLE001 - a failed fold leaves more layers, nothing worse
                log.warning("releasing a snapshot failed", exc_info=True)


def _tables(snapshot: Snapshot) -> dict[str, pa.Table]:
    return check_tables(snapshot, snapshot.build()) if isinstance(snapshot, AsyncSnapshot) else snapshot


def check_snapshot(operator: object, snapshot: object) -> Snapshot:
    """``snapshot`` as ``snapshot_state`` must return it: an AsyncSnapshot (its tables are
    checked when made), or a dict of tables (record batches become tables); raises TypeError
    naming ``operator`` otherwise."""
    if isinstance(snapshot, AsyncSnapshot):
        return snapshot
    return check_tables(operator, snapshot)


def check_tables(operator: object, tables: object) -> dict[str, pa.Table]:
    if not isinstance(tables, dict):
        raise TypeError(f"{operator!r}.snapshot_state returned {type(tables).__name__}, not a dict of tables")
    checked: dict[str, pa.Table] = {}
    for name, table in tables.items():
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(name, str) or not name or "/" in name or not isinstance(table, pa.Table):
            raise TypeError(f"{operator!r}.snapshot_state returned {name!r}: {type(table).__name__}; "
                            "expected non-empty names without '/' and pyarrow Tables")
        checked[name] = table
    return checked


# -- restoring --------------------------------------------------------------------------------

def read_task_state(restore: TaskRestore, num_operators: int) -> list[dict[str, pa.Table]]:
    """The tables of each operator of the chain (head first; ``{}`` for those without files)."""
    parts: list[dict[str, list[pa.Table]]] = [{} for _ in range(num_operators)]
    for f in restore.files:
        if f.name == SHARED_FILE or is_channel_state(f.name):
            continue  # an SST file a RocksDB snapshot's manifest references (read by the backend), in-flight data
        if not 0 <= f.operator_index < num_operators:
            raise StateRestoreError(f"checkpoint {restore.checkpoint_id}: state file {f.path} belongs to operator "
                                    f"{f.operator_index}, but the chain has {num_operators} operators")
        try:
            table = _read_state_file(f.path, f.size_bytes)
        except Exception as exc:  # noqa: BLE001 - any failure names the file
            raise StateRestoreError(f"checkpoint {restore.checkpoint_id}: cannot read state file {f.path}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        parts[f.operator_index].setdefault(f.name, []).append(table)
    return [{name: _concat(restore.checkpoint_id, name, tables) for name, tables in op.items()} for op in parts]


def _read_state_file(url: str, size: int) -> pa.Table:
    """A state file's table: from this TaskExecutor's verified copy when the restore has one
    (task-local recovery), else from the checkpoint storage; counted either way."""
    local = local_copy(url)
    if local is not None:
        try:
            table = ipc.open_file(local).read_all()
            record_read(size, local=True)
            return table
        except (OSError, pa.ArrowException) as exc:
            log.warning("the local copy of %s cannot be read (%s): reading the checkpoint storage's", url, exc)
    with fsspec.open(url, "rb") as fh:
        table = ipc.open_file(pa.PythonFile(fh, mode="r")).read_all()
    record_read(size, local=False)
    return table


def _concat(checkpoint_id: int, name: str, tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    try:
        merged = pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowInvalid as exc:
        raise StateRestoreError(f"checkpoint {checkpoint_id}: the state {name!r} of the old subtasks this subtask "
                                f"restores has different columns: {exc}") from exc
    return merged.replace_schema_metadata(tables[0].schema.metadata)
