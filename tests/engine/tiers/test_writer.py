"""WriteBehind: writes in order off the caller's thread, drops when full, survives a failing write,
runs idle work while there is nothing to write; ReaderPool: parallel calls, all awaited; both run their
threads' parallel regions alone."""

from __future__ import annotations

import threading
import time

from engine.tiers.readers import ReaderPool
from engine.tiers.writer import WriteBehind


def test_writes_happen_in_order_on_the_writer_thread():
    seen: list[tuple[str, list[int], str]] = []
    behind = WriteBehind(lambda ns, t: seen.append((ns, t, threading.current_thread().name)), name="t")
    try:
        assert all(behind.submit("a", [i]) for i in range(5))
        assert behind.flush(10) and behind.depth == 0
        assert [t for _, t, _ in seen] == [[i] for i in range(5)]
        assert {name for _, _, name in seen} == {"prefixrag-kv-t-writer"}
    finally:
        behind.close()
    assert not behind.submit("a", [9])  # closed: dropped, never raised


def test_a_full_queue_drops_and_a_failing_write_does_not_stop_the_writer():
    gate = threading.Event()
    done: list[list[int]] = []

    def write(_ns: str, tokens: list[int]) -> None:
        gate.wait(10)
        if tokens == [0]:
            raise RuntimeError("boom")
        done.append(tokens)

    behind = WriteBehind(write, name="t", queue_size=2)
    try:
        assert behind.submit("a", [0]) and behind.submit("a", [1])
        assert not behind.submit("a", [2])  # the queue holds two
        assert not behind.flush(0.05)  # still waiting on the gate
        gate.set()
        assert behind.flush(10) and done == [[1]]
    finally:
        behind.close()


def test_idle_work_runs_while_nothing_is_queued():
    ticks: list[float] = []
    behind = WriteBehind(
        lambda ns, t: None, name="t", idle=lambda: ticks.append(time.monotonic()), idle_s=0.02
    )
    try:
        deadline = time.monotonic() + 10
        while len(ticks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ticks) >= 3
    finally:
        behind.close()


def test_reader_pool_returns_results_in_order_after_every_call():
    pool = ReaderPool(threads=3, scratch_bytes=16, name="t")
    finished: list[int] = []

    def read(j: int, scratch) -> int:
        assert scratch.nbytes == 16
        time.sleep(0.01 * (5 - j))  # later items finish first
        finished.append(j)
        return 0 if j == 1 else j  # a failed read is a result

    try:
        assert pool.run_all(read, [0, 1, 2, 3, 4]) == [0, 0, 2, 3, 4]
        assert sorted(finished) == [0, 1, 2, 3, 4]  # none still running when it returned
    finally:
        pool.close()


def test_the_writer_runs_its_parallel_regions_alone():
    # a team of its own would shorten the engine's team's spin while it writes (engine/openmp_pool.py)
    import torch

    seen: list[int] = []

    def write(namespace: str, tokens: list[int]) -> None:
        torch.ones(4_000_000).add_(1)  # a parallel region on another thread
        seen.append(torch.get_num_threads())

    behind = WriteBehind(write, name="alone")
    try:
        assert behind.submit("tenant", [1, 2]) and behind.flush(30)
    finally:
        behind.close()
    assert seen == [1]
    assert torch.get_num_threads() >= 2  # the test's own thread keeps its team


def test_readers_run_their_parallel_regions_alone():
    import torch

    def read(j: int, scratch: object) -> int:
        torch.ones(4_000_000).add_(j)
        return torch.get_num_threads()

    pool = ReaderPool(threads=2, scratch_bytes=1 << 10, name="alone")
    try:
        assert pool.run_all(read, [1, 2, 3, 4]) == [1, 1, 1, 1]
    finally:
        pool.close()
