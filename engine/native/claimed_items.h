// Items handed to the thread team in runs, in order, each run to whichever thread is free first, the
// runs shrinking with what is left (OpenMP's guided schedule: a few dozen claims of a shared counter,
// not one per item): for items of uneven cost (attention rows at scattered positions), where a static
// split of the range leaves one thread waiting on the other. Which thread computes an item never
// changes its result.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>

namespace prefixrag {

// fn(item) for every item in [0, count), claimed in ascending runs; enter() and leave() around each
// thread's share
template <class Enter, class Fn, class Leave>
void claim_items(int64_t count, Enter enter, Fn fn, Leave leave) {
  if (count <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    enter();
    int64_t first = next.load(std::memory_order_relaxed);
    while (first < count) {
      const int64_t run = std::max<int64_t>(1, (count - first) / (2 * threads));
      if (!next.compare_exchange_weak(first, first + run, std::memory_order_relaxed)) continue;  // first reloaded
      for (int64_t item = first; item < first + run; ++item) fn(item);
      first = next.load(std::memory_order_relaxed);
    }
    leave();
  });
}

}  // namespace prefixrag
