// DecodeProgress (decode_progress.h): a thread that prints a line each time the delay passes before
// the work's end.
#include "train/decode_progress.h"

#include <algorithm>
#include <utility>

#include "core/elapsed.h"
#include "core/format.h"

DecodeProgress::DecodeProgress(std::string what, long images, std::function<long()> decoded,
                               std::chrono::milliseconds every, FILE* out)
    : thread_([this, what = std::move(what), images, decoded = std::move(decoded), every, out] {
        const auto start = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(m_);
        while (!cv_.wait_for(lock, every, [this] { return done_; })) {
          const long n = std::min(decoded(), images);
          std::fprintf(out, "%s: %s of %s images (%ld%%), %.0f s\n", what.c_str(), with_commas(n).c_str(),
                       with_commas(images).c_str(), images > 0 ? 100 * n / images : 0L, seconds_since(start));
          std::fflush(out);
        }
      }) {}

DecodeProgress::~DecodeProgress() {
  {
    std::lock_guard<std::mutex> lock(m_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}
