import time

import pytest

from engine.detokenizer import Detokenizer
from engine.request import QueueFullError, Request
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler


def _req(ids, arrival=None):
    r = Request(
        prompt_ids=list(ids),
        params=SamplingParams(),
        namespace="",
        detok=Detokenizer(None),
        eos_ids=frozenset(),
    )
    if arrival is not None:
        r.arrival = arrival
    return r


def test_longest_cached_prefix_first():
    cached = {1: 10, 2: 500, 3: 50}
    sched = Scheduler(lambda r: cached[r.prompt_ids[0]], max_waiting=8, aging_rate=0.0)
    now = time.perf_counter()
    for k in (1, 2, 3):
        sched.add(_req([k], arrival=now))
    assert [sched.pop().prompt_ids[0] for _ in range(3)] == [2, 3, 1]
    assert sched.pop() is None


def test_aging_prevents_starvation():
    cached = {1: 0, 2: 1000}
    sched = Scheduler(lambda r: cached[r.prompt_ids[0]], max_waiting=8, aging_rate=100.0)
    now = time.perf_counter()
    sched.add(_req([1], arrival=now - 60))  # waited a minute: 6000 tokens of priority
    sched.add(_req([2], arrival=now))
    assert sched.pop().prompt_ids == [1]


def test_ties_keep_arrival_order():
    sched = Scheduler(lambda r: 0, max_waiting=8, aging_rate=0.0)
    now = time.perf_counter()
    for k in range(5):
        sched.add(_req([k], arrival=now))
    assert [sched.pop().prompt_ids[0] for _ in range(5)] == [0, 1, 2, 3, 4]


def test_bounded_queue_raises():
    sched = Scheduler(lambda r: 0, max_waiting=2, aging_rate=0.0)
    sched.add(_req([1]))
    sched.add(_req([2]))
    with pytest.raises(QueueFullError) as info:
        sched.add(_req([3]))
    assert info.value.retry_after_s > 0


def test_cancelled_requests_leave_first():
    sched = Scheduler(lambda r: 100 if r.prompt_ids == [1] else 0, max_waiting=8, aging_rate=2000.0)
    a, b = _req([1]), _req([2])
    sched.add(a)
    sched.add(b)
    b.cancelled.set()
    assert sched.pop() is b
