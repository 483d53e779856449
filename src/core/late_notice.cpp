// LateNotice (late_notice.h): a thread that waits for the phase's end or the delay, whichever is first.
#include "core/late_notice.h"

#include <utility>

LateNotice::LateNotice(std::chrono::milliseconds delay, std::string line, FILE* out)
    : thread_([this, delay, line = std::move(line), out] {
        std::unique_lock<std::mutex> lock(m_);
        if (cv_.wait_for(lock, delay, [this] { return done_; })) return;
        std::fprintf(out, "%s\n", line.c_str());
        std::fflush(out);
      }) {}

LateNotice::~LateNotice() {
  {
    std::lock_guard<std::mutex> lock(m_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}
