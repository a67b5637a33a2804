"""The split enumerator: splits handed out once, booked per attempt, and given back (to the
front of the queue) when the attempt that took them is replaced."""

from __future__ import annotations

import pickle
import threading

import pytest

from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.common.errors import NotFoundError


class FakeSource:
    def __init__(self, n: int, name: str = "files") -> None:
        self.name = name
        self.n = n
        self.enumerated = 0

    def enumerate_splits(self) -> list[tuple[str, object]]:
        self.enumerated += 1
        return [(f"s{i}", {"file": i}) for i in range(self.n)]


def enumerator(**sources: FakeSource) -> SplitEnumerator:
    return SplitEnumerator(lambda vertex_id: sources[vertex_id])


def take(e: SplitEnumerator, attempt: str, vertex: str = "v", subtask: int = 0) -> str | None:
    resp = e.request(vertex, subtask, attempt)
    if resp.split is None:
        assert resp.no_more_splits
        return None
    assert pickle.loads(resp.split.payload) == {"file": int(resp.split.split_id[1:])}
    return resp.split.split_id


def drain(e: SplitEnumerator, attempt: str, vertex: str = "v") -> list[str]:
    got = []
    while (s := take(e, attempt, vertex)) is not None:
        got.append(s)
    return got


def test_splits_are_enumerated_once_and_handed_out_once() -> None:
    src = FakeSource(4)
    e = enumerator(v=src)
    assert [take(e, "a0"), take(e, "a1", subtask=1), take(e, "a0")] == ["s0", "s1", "s2"]
    assert drain(e, "a1") == ["s3"]
    assert take(e, "a0") is None
    assert src.enumerated == 1
    assert e.assigned["v"] == [(0, "s0"), (1, "s1"), (0, "s2"), (0, "s3")]


def test_returned_splits_go_to_the_front_in_the_order_taken() -> None:
    e = enumerator(v=FakeSource(6))
    assert [take(e, "a0"), take(e, "b0"), take(e, "a0")] == ["s0", "s1", "s2"]
    assert e.splits_of("a0") == ["s0", "s2"]
    assert e.return_splits("a0") == 2
    assert e.splits_of("a0") == []
    assert drain(e, "a1") == ["s0", "s2", "s3", "s4", "s5"]
    assert e.returned["v"] == ["s0", "s2"]


def test_a_finished_attempt_whose_output_is_lost_gives_its_splits_back() -> None:
    """The queue was empty (no_more_splits) when it finished; its replacement reads its splits."""
    e = enumerator(v=FakeSource(3))
    assert drain(e, "a0") == ["s0", "s1", "s2"]
    assert drain(e, "b0") == []
    e.return_splits("a0")
    assert drain(e, "a1") == ["s0", "s1", "s2"]


def test_every_split_is_read_by_exactly_one_surviving_attempt_over_restarts() -> None:
    e = enumerator(v=FakeSource(10))
    taken: dict[str, list[str]] = {}
    for attempt in ("a0", "b0"):
        taken[attempt] = [take(e, attempt), take(e, attempt)]
    e.return_splits("a0")
    taken["a1"] = [take(e, "a1")]
    e.return_splits("a1")  # replaced again before it finished
    e.return_splits("b0")
    for attempt in ("a2", "b1"):
        taken[attempt] = drain(e, attempt)
    surviving = taken["a2"] + taken["b1"]
    assert sorted(surviving, key=lambda s: int(s[1:])) == [f"s{i}" for i in range(10)]


def test_a_replaced_attempt_gets_no_more_splits() -> None:
    e = enumerator(v=FakeSource(3))
    take(e, "a0")
    e.return_splits("a0")
    with pytest.raises(NotFoundError, match="a0"):
        e.request("v", 0, "a0")
    assert drain(e, "a1") == ["s0", "s1", "s2"]


def test_return_is_idempotent_and_a_no_op_for_attempts_without_splits() -> None:
    e = enumerator(v=FakeSource(2))
    assert e.return_splits("never-asked") == 0
    take(e, "a0")
    assert e.return_splits("a0") == 1
    assert e.return_splits("a0") == 0
    assert drain(e, "a1") == ["s0", "s1"]


def test_sources_are_kept_apart() -> None:
    e = enumerator(v=FakeSource(2), w=FakeSource(2))
    assert take(e, "a0", "v") == "s0"
    assert take(e, "x0", "w") == "s0"
    e.return_splits("a0")
    assert drain(e, "x1", "w") == ["s1"]
    assert drain(e, "a1", "v") == ["s0", "s1"]


def test_concurrent_requests_and_returns_lose_and_duplicate_nothing() -> None:
    """Requests on RPC threads race with returns on the main thread: every split ends up with
    exactly one attempt that was never replaced."""
    e = enumerator(v=FakeSource(2000))
    kept: dict[str, list[str]] = {}
    lock = threading.Lock()

    def worker(subtask: int) -> None:
        generation = 0
        while True:
            attempt = f"{subtask}-{generation}"
            mine: list[str] = []
            try:
                while (s := take(e, attempt, subtask=subtask)) is not None:
                    mine.append(s)
                    if len(mine) == 7 and generation < 3:  # "fails": its splits go back
                        break
                else:
                    with lock:
                        kept[attempt] = mine
                    return
            except NotFoundError:
                pass
            e.return_splits(attempt)
            generation += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    everything = [s for splits in kept.values() for s in splits]
    assert sorted(everything) == sorted(f"s{i}" for i in range(2000))


def test_from_artifact_loads_the_source_of_the_vertex() -> None:
    calls = []

    class Artifacts:
        def load_source(self, uri: str, sha: str, vertex_id: str) -> FakeSource:
            calls.append((uri, sha, vertex_id))
            return FakeSource(1)

    e = SplitEnumerator.from_artifact(Artifacts(), "file:///a.zip", "abc")  # type: ignore[arg-type]
    assert take(e, "a0") == "s0"
    assert calls == [("file:///a.zip", "abc", "v")]


def split_at(e: SplitEnumerator, attempt: str, last_checkpoint_id: int) -> str | None:
    resp = e.request("v", 0, attempt, last_checkpoint_id)
    return resp.split.split_id if resp.split is not None else None


def test_a_restore_returns_only_the_splits_taken_after_the_restored_checkpoint() -> None:
    """Splits taken before the reader emitted barrier n are in checkpoint n's source state (or
    were read to the end): they stay with the new attempt. Later ones go back."""
    e = enumerator(v=FakeSource(6))
    assert split_at(e, "a0", 0) == "s0"          # before any barrier: in the state of checkpoint 1
    assert split_at(e, "a0", 1) == "s1"          # after barrier 1: in the state of checkpoint 2
    assert split_at(e, "a0", 2) == "s2"          # after barrier 2: in no checkpoint yet
    assert e.return_splits("a0", restored_checkpoint_id=2, new_attempt_id="a1") == 1
    assert e.splits_of("a1") == ["s0", "s1"]
    assert split_at(e, "a1", 2) == "s2"          # the one taken after barrier 2 is read again
    # the new attempt fails before any new checkpoint: restoring checkpoint 2 again
    assert e.return_splits("a1", restored_checkpoint_id=2, new_attempt_id="a2") == 1
    assert e.splits_of("a2") == ["s0", "s1"]
    # restored from checkpoint 1 instead (2 proved unreadable): s1 and later go back
    assert e.return_splits("a2", restored_checkpoint_id=1, new_attempt_id="a3") == 1
    assert e.splits_of("a3") == ["s0"]
    assert drain(e, "a3") == ["s1", "s2", "s3", "s4", "s5"]


def test_without_a_checkpoint_to_restore_every_split_goes_back() -> None:
    e = enumerator(v=FakeSource(3))
    assert [split_at(e, "a0", 0), split_at(e, "a0", 4)] == ["s0", "s1"]
    assert e.return_splits("a0", restored_checkpoint_id=0, new_attempt_id="a1") == 2
    assert e.splits_of("a1") == []


def test_a_new_leader_books_the_splits_running_sources_took_after_its_checkpoint_and_hands_out_the_rest() -> None:
    old = enumerator(v=FakeSource(6))
    assert [old.request("v", 0, "a0", 0).split.split_id, old.request("v", 1, "a1", 0).split.split_id] == ["s0", "s1"]
    state = old.snapshot(3)  # checkpoint 3: both taken before its barrier: pending are s0..s5 minus none read yet
    # after checkpoint 3 the running sources take two more, then the leader dies
    after = [old.request("v", 0, "a0", 3).split.split_id, old.request("v", 1, "a1", 3).split.split_id]
    assert after == ["s2", "s3"]
    new = enumerator(v=FakeSource(6))
    new.restore(state)
    assert new.adopt("a0", "v", [("s0", 0), ("s2", 3)]) == sum(1 for s in state["v"] if s["split_id"] in ("s0", "s2"))
    new.adopt("a1", "v", [("s1", 0), ("s3", 3)])
    # every split is read once: the rest go to whoever asks; none of the adopted ones again
    assert drain(new, "a0") == ["s4", "s5"]
    # a0 fails later and is restored from checkpoint 3: what it took after 3 goes back, nothing else
    assert new.return_splits("a0", 3, "a0-2") == 1
    assert drain(new, "a0-2") == ["s2"]
