"""Python worker processes: where a task's per-row functions run, so that the slots of one
TaskExecutor use a core each instead of sharing its GIL.

The slots of a TaskExecutor are threads of one Python process. Arrow compute releases the GIL,
but a per-row ``map`` / ``filter`` / ``flat_map`` function is Python bytecode, one call per row:
two such subtasks in one process run at about one core's pace together. As PySpark's and
PyFlink's Python workers do, a task whose chain has such operators starts a process of its own
(``PythonWorker``, ``python.execution-mode: process``, the default) and sends it each batch an
operator does not vectorise; the process runs the same operator (loaded from the same file of
the job artifact) and sends back its output batches. Batches go both ways as Arrow IPC streams
over a Unix socket pair.

Only stateless operators go there (their results depend on the batch alone), and the task's
thread waits for each answer, so the order of batches, watermarks and checkpoint barriers, and
everything a checkpoint holds, is exactly what it is on the task thread. Keyed process
functions, reduces and window functions keep running on the task thread (their state is the
task's).

A task starts its worker only once its per-row functions have taken
``python.worker.start-after`` (200 ms) on its own thread: a small job never pays for a process.
If the worker cannot start (its Python cannot load the chain), the task logs why and goes on on
its own thread. If it dies while running a batch, the task fails with ``PythonWorkerError`` and
the job restarts under its restart strategy. A cancelled task kills its worker, which also
stops a function that never returns; a worker whose TaskExecutor dies is killed with it
(``PR_SET_PDEATHSIG``) or exits when its socket closes."""

from yarnflow.worker.pyworker.handle import PythonWorker, PythonWorkerError, offloadable

__all__ = ["PythonWorker", "PythonWorkerError", "offloadable"]
