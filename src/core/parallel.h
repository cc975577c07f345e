// ParallelFor: the one host thread pool idiom of the CPU code (synthetic layers, checkpoint loads,
// the CPU backend). Work items are handed out one at a time, so uneven items balance.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace mxmoe {

// Runs fn(i) for every i in [0, n) on up to `threads` threads (<= 0: the hardware's count); the
// calling thread is one of them.
template <class Fn>
void ParallelFor(int64_t n, int threads, const Fn& fn) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1)));
  std::atomic<int64_t> next{0};
  const auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace mxmoe
