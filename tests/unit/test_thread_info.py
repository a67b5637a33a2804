"""Thread dumps and the thread samples flame graphs are made of (common/thread_info.py), and the
flame graph built from them (am/rest/flamegraph.py): a thread computing counts as on the CPU,
one waiting as off it, stacks read outermost first in "module.function:line" form, cut to the
depth asked, and a graph's nodes count the samples through them."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from yarnflow.am.rest.flamegraph import flame_graph
from yarnflow.common.messages import ThreadInfoSample
from yarnflow.common.thread_info import check_request, frame_names, sample, stringified, thread_dump

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def burn_cpu_here(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1


def wait_here(stop: threading.Event) -> None:
    stop.wait()


@pytest.fixture
def busy_and_idle() -> Iterator[dict[int, threading.Thread]]:
    stop = threading.Event()
    threads = {0: threading.Thread(target=burn_cpu_here, args=(stop,), name="busy"),
               1: threading.Thread(target=wait_here, args=(stop,), name="idle")}
    for t in threads.values():
        t.start()
    yield threads
    stop.set()
    for t in threads.values():
        t.join(5)


def test_a_computing_thread_is_on_the_cpu_and_a_waiting_one_is_not(busy_and_idle: dict[int, threading.Thread]) -> None:
    samples = sample(busy_and_idle, 30, 10, 50)
    assert sum(s.count for s in samples if s.subtask_index == 0) == 30
    assert sum(s.count for s in samples if s.subtask_index == 1) == 30
    busy = [s for s in samples if s.subtask_index == 0]
    idle = [s for s in samples if s.subtask_index == 1]
    # the busy thread competes for the GIL with the sampler and this test: most of its samples,
    # not all, find it on the CPU; the waiting thread never is
    assert sum(s.count for s in busy if s.on_cpu) >= 15
    assert not any(s.on_cpu for s in idle)
    assert all(any(f.startswith(f"{__name__}.burn_cpu_here:") for f in s.frames) for s in busy)
    assert all(f"{__name__}.wait_here:" in " ".join(s.frames) for s in idle)
    # outermost first: the thread's bootstrap, then its target
    frames = idle[0].frames
    assert frames[0].startswith("threading.Thread._bootstrap:")
    assert [f.split(":")[0] for f in frames].index(f"{__name__}.wait_here") < len(frames) - 1
    # identical samples are counted once
    assert len({(s.subtask_index, s.on_cpu, tuple(s.frames)) for s in samples}) == len(samples)


def test_stacks_are_cut_to_their_innermost_frames(busy_and_idle: dict[int, threading.Thread]) -> None:
    [idle] = sample({1: busy_and_idle[1]}, 1, 0, 2)
    assert len(idle.frames) == 2
    assert idle.frames[-1].startswith("threading.Condition.wait:")
    assert idle.frames[0].startswith("threading.Event.wait:")
    assert frame_names(None, 5) == []


def test_sampling_stops_when_asked_and_skips_an_ended_thread() -> None:
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    assert sample({0: ended}, 5, 1, 10) == []
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    stop_event = threading.Event()
    t = threading.Thread(target=wait_here, args=(stop_event,))
    t.start()
    try:
        found = sample({0: t}, 100, 1, 10, stop)
    finally:
        stop_event.set()
        t.join(5)
    assert sum(s.count for s in found) == 2


@pytest.mark.parametrize(("num", "delay", "depth", "why"), [
    (0, 50, 100, "num_samples must be 1..1000"), (1001, 0, 100, "num_samples"), (10, -1, 100, "delay_ms"),
    (10, 50, 0, "max_depth must be 1..1000"), (1000, 301, 100, "take longer than 300 s")])
def test_requests_out_of_bounds_are_refused(num: int, delay: int, depth: int, why: str) -> None:
    assert why in check_request(num, delay, depth)
    assert check_request(100, 50, 100) == ""


def test_a_thread_dump_names_every_thread_with_its_stack(busy_and_idle: dict[int, threading.Thread]) -> None:
    infos = {i.name: i for i in thread_dump()}
    assert {"MainThread", "busy", "idle"} <= set(infos)
    idle = infos["idle"]
    assert idle.ident == busy_and_idle[1].ident and idle.cpu_seconds >= 0
    assert any("in wait_here" in f for f in idle.frames)
    text = stringified(idle)
    assert text.startswith(f'"idle" daemon=False id={idle.ident} cpu=') and "in wait_here" in text
    assert infos["busy"].cpu_seconds > 0


def test_a_flame_graph_counts_the_samples_through_each_frame() -> None:
    samples = [ThreadInfoSample(0, True, ["a:1", "b:2", "c:3"], 5), ThreadInfoSample(1, True, ["a:1", "b:2"], 2),
               ThreadInfoSample(0, False, ["a:1", "w:9"], 3)]
    full = flame_graph(samples)
    assert full == {"name": "root", "value": 10, "children": [
        {"name": "a:1", "value": 10, "children": [
            {"name": "b:2", "value": 7, "children": [{"name": "c:3", "value": 5, "children": []}]},
            {"name": "w:9", "value": 3, "children": []}]}]}
    assert flame_graph(samples, "ON_CPU")["value"] == 7
    off = flame_graph(samples, "OFF_CPU")
    assert off["value"] == 3 and off["children"][0]["children"] == [{"name": "w:9", "value": 3, "children": []}]
    assert flame_graph([], "FULL") == {"name": "root", "value": 0, "children": []}
