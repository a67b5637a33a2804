"""Credit-based flow control's accounting (worker/network/credit.py): a sender never sends
beyond the credit its receiver announced, backlog makes a channel borrow floating buffers, and
borrowed buffers go back to the pool and on to the channels waiting for them."""

from __future__ import annotations

import random

import pytest

from yarnflow.worker.network.credit import FloatingBufferPool, ReceiverCredit, SenderCredit, buffers_for

pytestmark = pytest.mark.timeout(30)

SEGMENT = 1000


def test_a_batch_takes_one_buffer_per_segment_started():
    assert buffers_for(0, SEGMENT) == 1
    assert buffers_for(1, SEGMENT) == 1
    assert buffers_for(1000, SEGMENT) == 1
    assert buffers_for(1001, SEGMENT) == 2
    assert buffers_for(10_000, SEGMENT) == 10


def test_a_sender_cannot_take_more_than_its_credit():
    s = SenderCredit(2)
    assert s.can_send(2) and not s.can_send(3)
    s.take(2)
    assert not s.can_send(1)
    with pytest.raises(ValueError, match="against 0 credits"):
        s.take(1)
    s.grant(1)
    assert s.can_send(1) and s.peak == 2
    with pytest.raises(ValueError):
        s.grant(0)


def test_a_receiver_refuses_a_batch_beyond_the_credit_it_announced():
    r = ReceiverCredit(2)
    assert r.initial() == 2
    with pytest.raises(ValueError, match="3 buffers against 2 credits"):
        r.on_batch(3, 0)


def test_backlog_beyond_the_credit_borrows_floating_buffers_and_returns_them():
    pool = FloatingBufferPool(4)
    r = ReceiverCredit(2, pool)
    r.initial()
    # one batch arrives with 5 buffers queued behind it: credit 1 left, so it borrows 4 (all the pool has)
    assert r.on_batch(1, backlog=5) == 4
    assert r.borrowed == 4 and pool.available == 0 and r.announced == 5
    # the producer sends them all; its backlog is gone
    for left in (4, 3, 2, 1, 0):
        assert r.on_batch(1, backlog=left) == 0
    assert r.used == 6 and r.announced == 0
    # as the task takes them, borrowed buffers beyond the exclusive ones go back to the pool
    given_back = []
    for _ in range(6):
        given_back.append(r.on_taken(1))
    assert r.borrowed == 0 and pool.available == 4
    assert sum(given_back) == 2 and r.announced == 2  # only the exclusive credit is announced again


def test_a_waiting_channel_gets_the_buffers_another_returns_in_the_order_it_asked():
    pool = FloatingBufferPool(2)
    a, b, c = (ReceiverCredit(1, pool) for _ in range(3))
    lent: list[tuple[str, int]] = []
    for name, ch in (("a", a), ("b", b), ("c", c)):
        ch.initial()
        ch.on_lent = lambda channel, n, name=name: lent.append((name, n))
    assert a.on_batch(1, backlog=3) == 2  # a borrows the whole pool
    assert b.on_batch(1, backlog=2) == 0 and c.on_batch(1, backlog=1) == 0  # b then c wait
    for _ in range(2):
        a.on_batch(1, backlog=0)
    assert a.on_taken(1) == 1  # a's exclusive buffer is announced again first
    assert lent == []
    a.on_taken(1)
    a.on_taken(1)  # a's backlog is gone: its borrowed buffers go to b, which asked first
    assert lent == [("b", 1), ("b", 1)] and b.announced == 2 and b.borrowed == 2 and a.borrowed == 0
    b.close()  # b's channel ends: its buffers go to c
    assert lent[2:] == [("c", 1)] and c.borrowed == 1 and pool.available == 1


@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_never_exceeds_credit(seed: int):
    """A producer with a random backlog and channels that a random task drains at random: the
    bytes a channel holds never exceed what it owns, the producer's credit always equals what
    the channel announced minus what is on the wire, and no buffer is lost."""
    rng = random.Random(seed)
    pool = FloatingBufferPool(rng.randint(0, 6))
    channels = []
    for _ in range(rng.randint(1, 4)):
        rc = ReceiverCredit(rng.randint(1, 3), pool)
        sc = SenderCredit(rc.initial())
        channels.append({"rc": rc, "sc": sc, "queue": [], "wire": [], "held": [], "sent": 0, "got": 0})

    def announce(ch: dict, n: int) -> None:
        if n:
            ch["wire"].append(("credit", n))

    for ch in channels:
        ch["rc"].on_lent = lambda rc, n: announce(next(c for c in channels if c["rc"] is rc), n)
    for _ in range(3000):
        ch = rng.choice(channels)
        rc, sc = ch["rc"], ch["sc"]
        action = rng.random()
        if action < 0.3:  # the producer queues a batch
            ch["queue"].append(rng.randint(1, 3 * SEGMENT))
        elif action < 0.55 and ch["queue"]:  # the producer sends the head if it has the credit
            nbytes = ch["queue"][0]
            if buffers_for(nbytes, SEGMENT) > rc.exclusive:  # too big for the channel: a slice goes
                nbytes = rc.exclusive * SEGMENT
            need = buffers_for(nbytes, SEGMENT)
            if sc.can_send(need):
                sc.take(need)
                ch["queue"][0] -= nbytes
                if not ch["queue"][0]:
                    ch["queue"].pop(0)
                backlog = sum(buffers_for(b, SEGMENT) for b in ch["queue"])
                ch["wire"].append(("batch", need, nbytes, backlog))
        elif action < 0.8 and ch["wire"]:  # the wire delivers the oldest message
            kind, *rest = ch["wire"].pop(0)
            if kind == "credit":
                sc.grant(rest[0])
            else:
                need, nbytes, backlog = rest
                announce(ch, rc.on_batch(need, backlog))
                ch["held"].append((need, nbytes))
                ch["got"] += 1
        elif ch["held"]:  # the task takes a batch
            need, _ = ch["held"].pop(0)
            announce(ch, rc.on_taken(need))
        for c in channels:
            r = c["rc"]
            on_wire = sum(m[1] for m in c["wire"] if m[0] == "batch")
            credit_on_wire = sum(m[1] for m in c["wire"] if m[0] == "credit")
            assert r.used + r.announced == r.owned
            assert c["sc"].credit + on_wire + credit_on_wire == r.announced
            assert sum(n for n, _ in c["held"]) == r.used <= r.owned
            assert sum(b for _, b in c["held"]) <= r.owned * SEGMENT
        assert pool.available + sum(c["rc"].borrowed for c in channels) == pool.size


def test_a_finished_producers_whole_backlog_is_credited_at_once_and_repaid_first():
    """Overdraw: the task takes a finished producer's rest at once (an unaligned checkpoint
    records it): credit for the whole backlog beyond the channel's two buffers, repaid by the
    first buffers the task frees; then the channel is back to its own two."""
    ch = ReceiverCredit(2)
    ch.initial()
    assert ch.on_batch(1, backlog=10) == 0
    assert ch.overdraw() == 9 and ch.announced == 10 and ch.overdrawn == 9
    assert ch.overdraw() == 0  # nothing more until the backlog grows
    for _ in range(10):
        ch.on_batch(1, backlog=0)
    assert ch.announced == 0
    freed = [ch.on_taken(1) for _ in range(11)]
    assert sum(freed) == 2 and ch.overdrawn == 0 and ch.announced == 2
