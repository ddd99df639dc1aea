// The thread team of a native decode step (decode_step.cpp, decode_step_f32.cpp).
//
// Invariant: work [0, n) splits into one contiguous part per thread; callers split by output column
// or head, never inside a sum, so a result does not depend on the thread count.
#pragma once
#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace prefixrag {

// The threads of one decode step: workers sleep between steps and spin during one, so the many
// short parallel sections of a step cost no wake-up each (OpenMP's passive wait would, in a server).
// Work [0, n) splits into one contiguous part per thread; callers split by output column or head,
// never inside a sum, so the result does not depend on the thread count.
class Team {
 public:
  explicit Team(int threads) : threads_(threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      active_.store(false);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int threads() const { return threads_; }
  void begin() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_.store(true);
    }
    wake_.notify_all();
  }
  void end() { active_.store(false); }
  void parallel(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (threads_ == 1 || n < 2) {
      fn(0, n);
      return;
    }
    fn_ = &fn;
    n_ = n;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    job_.fetch_add(1, std::memory_order_release);
    run_part(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) pause(spins);
  }

 private:
  static void pause(int spins) {
    if (spins % 256 == 255) sched_yield();  // another thread (the event loop) may need this core
    else _mm_pause();
  }
  void run_part(int t) {
    int64_t a = n_ * t / threads_, b = n_ * (t + 1) / threads_;
    if (a < b) (*fn_)(a, b);
  }
  void work(int t) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return active_.load() || stop_; });
        if (stop_) return;
      }
      for (int spins = 0; active_.load(std::memory_order_acquire) || job_.load(std::memory_order_acquire) != seen;) {
        if (job_.load(std::memory_order_acquire) != seen) {
          seen = job_.load(std::memory_order_acquire);
          run_part(t);
          pending_.fetch_sub(1, std::memory_order_release);
          spins = 0;
        } else {
          pause(spins++);
        }
      }
    }
  }
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<bool> active_{false};
  bool stop_ = false;
  std::atomic<uint64_t> job_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
};

struct Session {
  explicit Session(Team& team) : team(team) { team.begin(); }
  ~Session() { team.end(); }
  Team& team;
};

}  // namespace prefixrag
