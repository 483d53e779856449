// A parallel loop for the start-up work that is one independent task per file or image (reading
// image headers, decoding an image folder into memory, normalisation statistics).
#pragma once

#include <functional>

// Runs fn(i) for every i in [0, n) on `threads` threads (the calling thread is one of them). If fn
// throws, no further indices are started, and once the running ones have finished the exception of
// the lowest index that threw is rethrown here.
void parallel_for(int n, int threads, const std::function<void(int)>& fn);
