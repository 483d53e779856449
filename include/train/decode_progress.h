// How far a long decoding at start has come: a folder of thousands of images decoded into memory
// (--cache-decoded), or the normalisation sample decoded at a large --image-size, takes minutes with
// nothing else printed, and a silent minute reads as a hang. Like LateNotice (core/late_notice.h) it
// prints nothing when the work ends within the delay; then, from a thread of its own, a line every
// delay until it ends:
//   data: decoding into memory: 4,321 of 20,000 images (21%), 10 s
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/late_notice.h"

class DecodeProgress {
 public:
  // `decoded` is called from the thread: it reads a counter that the work updates atomically
  // (image_folder.h images_decoded()).
  DecodeProgress(std::string what, long images, std::function<long()> decoded,
                 std::chrono::milliseconds every = kLateNoticeDelay, FILE* out = stdout);
  // The work is over: no more lines (the destructor waits for the thread).
  ~DecodeProgress();
  DecodeProgress(const DecodeProgress&) = delete;
  DecodeProgress& operator=(const DecodeProgress&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};
