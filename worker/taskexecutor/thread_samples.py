"""Samples of a TaskExecutor's tasks for flame graphs (``requestThreadInfoSamples``): each task's
own thread, and, for a task whose per-row functions run in its Python worker process, that
process's thread too, sampled by the worker itself at the same time (its stacks come under a
"python worker (pid N)" frame: a subtask with a worker has two threads of work, and its flame
graph shows where each of them spends its time)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from yarnflow.common.messages import ThreadInfoSample
from yarnflow.common.thread_info import sample


def sample_tasks(tasks: Iterable[Any], num_samples: int, delay_ms: int, max_depth: int,
                 stop: Callable[[], bool]) -> list[ThreadInfoSample]:
    """Samples of ``tasks`` (``worker.task.Task``); their workers' are asked for alongside."""
    tasks = list(tasks)
    found: list[ThreadInfoSample] = []
    lock = threading.Lock()

    def from_worker(task: Any) -> None:
        samples = task.python_worker.sample(num_samples, delay_ms, max_depth)
        with lock:
            found.extend(ThreadInfoSample(task.tdd.subtask_index, s.on_cpu, s.frames, s.count) for s in samples)

    askers = [threading.Thread(target=from_worker, args=(t,), name="thread-sampler-worker", daemon=True)
              for t in tasks if t.python_worker is not None]
    for asker in askers:
        asker.start()
    own = sample({t.tdd.subtask_index: t.thread for t in tasks}, num_samples, delay_ms, max_depth, stop)
    for asker in askers:
        asker.join()
    return own + found
