"""The disk tier's folder: budget, LRU order (a prefix loses its tail first), crashed writers' leftovers."""

import os
import subprocess
import sys
import time

from engine.tiers.blockfile import TEMP_PREFIX
from engine.tiers.directory import BlockDirectory


def _put(folder: BlockDirectory, key: str, size: int, depth: int, when_ns: int) -> None:
    path = folder.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    folder.added(size)
    folder.touch(key, depth, when_ns)


def test_reserve_evicts_least_recently_used_and_deepest_first(tmp_path):
    folder = BlockDirectory(tmp_path, capacity_bytes=5000)
    t = time.time_ns()
    for j, key in enumerate(["a0", "a1", "a2"]):  # one prefix, written at t
        _put(folder, f"{key}" + "0" * 62, 1000, j, t)
    _put(folder, "b0" + "0" * 62, 1000, 0, t + 10**9)  # a newer prefix
    assert folder.used_bytes == 4000
    assert folder.reserve(3000, keep=set())
    left = sorted(p.name[:2] for p in tmp_path.rglob("*.kvb"))
    assert left == ["a0", "b0"]  # a2 then a1 went: a prefix's tail goes before its head
    assert folder.evictions == 2 and folder.evicted_bytes == 2000
    assert folder.used_bytes == 2000


def test_reserve_keeps_the_prefix_being_written(tmp_path):
    folder = BlockDirectory(tmp_path, capacity_bytes=3000)
    t = time.time_ns()
    keys = [f"c{j}" + "0" * 62 for j in range(3)]
    for j, key in enumerate(keys):
        _put(folder, key, 1000, j, t)
    assert not folder.reserve(1000, keep=set(keys))  # only its own blocks could go: refused
    assert folder.used_bytes == 3000
    assert not folder.reserve(4000)  # larger than the whole budget


def test_touch_refreshes_and_reports_gone_files(tmp_path):
    folder = BlockDirectory(tmp_path, capacity_bytes=10_000)
    t = time.time_ns()
    _put(folder, "d" * 64, 100, 0, t - 10**9)
    _put(folder, "e" * 64, 100, 0, t)
    assert folder.touch("d" * 64, 0, t + 10**9)  # now the most recent
    assert folder.reserve(9900)  # room for 9,900 means one 100-byte block goes: the older one
    assert folder.exists("d" * 64) and not folder.exists("e" * 64)
    assert not folder.touch("e" * 64, 0, t)


def test_scan_counts_what_other_processes_wrote_and_removes_dead_writers_temp_files(tmp_path):
    folder = BlockDirectory(tmp_path, capacity_bytes=10_000)
    other = BlockDirectory(tmp_path, capacity_bytes=10_000)  # another replica on the same folder
    _put(other, "f" * 64, 700, 0, time.time_ns())
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    sub = tmp_path / "ff"
    (sub / f"{TEMP_PREFIX}{dead.stdout.strip()}-abc").write_bytes(b"half a block")
    live = sub / f"{TEMP_PREFIX}{os.getpid()}-def"
    live.write_bytes(b"being written")
    files = folder.rescan()
    assert [(size, path.name) for _, size, path in files] == [(700, "f" * 64 + ".kvb")]
    assert folder.used_bytes == 700
    assert live.exists() and not (sub / f"{TEMP_PREFIX}{dead.stdout.strip()}-abc").exists()


def test_remove_forgets_the_bytes(tmp_path):
    folder = BlockDirectory(tmp_path, capacity_bytes=10_000)
    _put(folder, "9" * 64, 300, 0, time.time_ns())
    folder.remove("9" * 64)
    folder.remove("9" * 64)  # gone already: fine
    assert folder.used_bytes == 0 and not folder.exists("9" * 64)
