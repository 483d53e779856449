// parallel_for (core/parallel.h): indices handed out one at a time from a shared counter, so that
// slow items (a large image among small ones) do not leave threads idle.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

void parallel_for(int n, int threads, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  int error_index = n;
  std::exception_ptr error;
  auto work = [&] {
    for (int i; !failed && (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < error_index) {
          error_index = i;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}
