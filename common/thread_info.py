"""What a process's threads are doing: thread dumps (every thread and its stack) and the samples
flame graphs are made of (Flink's ThreadInfoSample), for the AppMaster and the TaskExecutors.

A sample says whether its thread was on the CPU. Flink reads the JVM's thread state at the
moment of the sample; in Python that moment is useless (the sampler holds the GIL, so a thread
running Python code is parked waiting for it just then). Here a sample counts as on the CPU when
its thread used the CPU for at least half of the time since the previous sample, read from the
thread's own CPU clock (``time.pthread_getcpuclockid``, Linux): a task computing is on the CPU,
one waiting for input, for the GIL or for its output to drain is not."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from types import FrameType

from yarnflow.common.messages import ThreadInfo, ThreadInfoSample

#: the bounds a sampling request is held to (a request outside them is the caller's error)
MAX_SAMPLES = 1000
MAX_DELAY_MS = 10_000
MAX_DEPTH = 1000
MAX_SAMPLING_MS = 300_000
#: the share of the time between two samples a thread must have used the CPU to count as on it
ON_CPU_SHARE = 0.5


def cpu_seconds(thread: threading.Thread) -> float:
    """The CPU time ``thread`` used so far; -1 when it cannot be read (the thread ended, or the
    platform has no per-thread CPU clocks)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
    except (AttributeError, OSError, OverflowError, ProcessLookupError):
        return -1.0


def thread_dump() -> list[ThreadInfo]:
    """Every thread of this process with its stack, by name."""
    frames = sys._current_frames()
    infos = []
    for t in sorted(threading.enumerate(), key=lambda t: t.name):
        frame = frames.get(t.ident or -1)
        stack = [line.rstrip("\n") for line in traceback.format_stack(frame)] if frame is not None else []
        infos.append(ThreadInfo(t.name, t.ident or 0, t.daemon, round(cpu_seconds(t), 3), stack))
    return infos


def stringified(info: ThreadInfo) -> str:
    """A thread as a thread dump prints it (Flink's ``stringifiedThreadInfo``)."""
    cpu = f" cpu={info.cpu_seconds:.3f}s" if info.cpu_seconds >= 0 else ""
    return "\n".join([f'"{info.name}" daemon={info.daemon} id={info.ident}{cpu}', *info.frames]) + "\n"


def frame_names(frame: FrameType | None, max_depth: int) -> list[str]:
    """``frame``'s stack as "module.function:line", outermost first, cut to its innermost
    ``max_depth`` frames."""
    names: list[str] = []
    while frame is not None and len(names) < max_depth:
        code = frame.f_code
        module = frame.f_globals.get("__name__") or code.co_filename
        names.append(f"{module}.{getattr(code, 'co_qualname', code.co_name)}:{frame.f_lineno}")
        frame = frame.f_back
    names.reverse()
    return names


def check_request(num_samples: int, delay_ms: int, max_depth: int) -> str:
    """Why a sampling request is out of bounds; "" when it is fine."""
    if not 1 <= num_samples <= MAX_SAMPLES:
        return f"num_samples must be 1..{MAX_SAMPLES}, not {num_samples}"
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        return f"delay_ms must be 0..{MAX_DELAY_MS}, not {delay_ms}"
    if not 1 <= max_depth <= MAX_DEPTH:
        return f"max_depth must be 1..{MAX_DEPTH}, not {max_depth}"
    if num_samples * delay_ms > MAX_SAMPLING_MS:
        return f"{num_samples} samples {delay_ms} ms apart take longer than {MAX_SAMPLING_MS // 1000} s"
    return ""


def sample(threads: Mapping[int, threading.Thread], num_samples: int, delay_ms: int, max_depth: int,
           stop: Callable[[], bool] = lambda: False) -> list[ThreadInfoSample]:
    """``num_samples`` samples, ``delay_ms`` apart, of each of ``threads`` (subtask index ->
    its thread), identical ones counted together. A thread that ended is no longer sampled;
    ``stop`` ends the sampling early (the process is stopping)."""
    counts: Counter[tuple[int, bool, tuple[str, ...]]] = Counter()
    last = {i: (time.monotonic(), cpu_seconds(t)) for i, t in threads.items()}
    for n in range(num_samples):
        if n or delay_ms:
            time.sleep(max(delay_ms, 1) / 1000)  # (at least a tick: a thread's CPU share needs an interval)
        if stop():
            break
        frames = sys._current_frames()
        for index, thread in threads.items():
            frame = frames.get(thread.ident or -1)
            if frame is None or not thread.is_alive():
                continue
            now, cpu = time.monotonic(), cpu_seconds(thread)
            then, cpu_then = last[index]
            last[index] = (now, cpu)
            on_cpu = cpu >= 0 and cpu_then >= 0 and (cpu - cpu_then) >= ON_CPU_SHARE * (now - then)
            counts[(index, on_cpu, tuple(frame_names(frame, max_depth)))] += 1
        del frames
    return [ThreadInfoSample(index, on_cpu, list(stack), count)
            for (index, on_cpu, stack), count in sorted(counts.items())]
