"""engine/openmp_pool.py: freeing the calling thread's OpenMP workers really ends those threads, and a
later parallel region on that thread builds its team again (in a fresh process: other tests' engine
and writer threads would change the thread count), also where another libgomp was loaded first."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import os, sys, time
if "second-runtime" in sys.argv:
    import sklearn  # its wheel's own libgomp, loaded before torch's
import torch
from engine.openmp_pool import loaded_libgomps, release_thread_pool

if "second-runtime" in sys.argv:
    assert len(loaded_libgomps()) == 2, loaded_libgomps()

def threads():
    return len(os.listdir("/proc/self/task"))

def settle(expected):
    deadline = time.monotonic() + 5
    while threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()

workers = torch.get_num_threads() - 1
assert workers >= 1, "every machine this project runs on has 2 cores or more"
x = torch.ones(8_000_000)
x.add_(1)  # a parallel region: this thread's team exists
with_team = threads()
assert release_thread_pool()
assert settle(with_team - workers) == with_team - workers, (with_team, threads())
x.add_(1)
assert settle(with_team) == with_team, (with_team, threads())
assert bool((x == 3).all())
print("ok")
"""


def _check(*args: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_release_ends_this_threads_workers_and_a_later_region_rebuilds_them():
    _check()


def test_release_reaches_torchs_runtime_when_another_libgomp_loaded_first():
    # sentence-transformers imports scikit-learn, whose wheel bundles a libgomp of its own, which may
    # come first in the process's maps: torch's must be released all the same
    _check("second-runtime")


ALONE = """
import os, threading, torch
from engine.openmp_pool import run_alone

assert torch.get_num_threads() >= 2, "every machine this project runs on has 2 cores or more"
x = torch.ones(8_000_000)

def background(counts):
    run_alone()
    before = len(os.listdir("/proc/self/task"))
    x.add_(1)  # a parallel region anywhere else: here it runs on this thread alone
    counts.append(len(os.listdir("/proc/self/task")) - before)
    counts.append(torch.get_num_threads())

counts = []
t = threading.Thread(target=background, args=(counts,))
t.start(); t.join()
assert counts == [0, 1], counts
assert bool((x == 2).all())
assert torch.get_num_threads() >= 2  # other threads keep their teams
print("ok")
"""


def test_a_thread_run_alone_starts_no_workers_and_leaves_other_threads_theirs():
    done = subprocess.run([sys.executable, "-c", ALONE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
