// Buffers that a second stream reads while the first goes on writing others: the first waits for the
// second only before it overwrites a buffer the second has yet to finish reading, not after every
// read. TrainingNetwork's weight gradients' lane reads each conv's output gradient, and with more
// gradient buffers than the data gradients need, the lane may run behind them (FusedPattern::LaggingWgrad).
//
//   StreamReads reads({g1, g3, g4});
//   ...enqueue a read of g3 on `lane`...; reads.read(g3, lane);   // an event on the lane after it
//   reads.before_write(g3, main);                                  // main waits for it, once
//   ...enqueue the write of g3 on main...
//
// Events are recorded and waited in the order the work is enqueued, so it works inside a stream
// capture as well as eagerly. After the first stream joins the second (waits for all of it), reset()
// drops the pending reads: a wait in a later capture on an event recorded outside it would be illegal.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "core/handles.h"

class StreamReads {
 public:
  explicit StreamReads(const std::vector<const void*>& buffers);
  // A read of `buffer` was just enqueued on `reader`; `buffer` must be one of the constructor's.
  void read(const void* buffer, cudaStream_t reader);
  // `writer` waits for the last read of `buffer` not yet waited for; nothing for a buffer never read
  // since the last reset() or for one not tracked.
  void before_write(const void* buffer, cudaStream_t writer);
  void reset();
  bool pending(const void* buffer) const;

 private:
  struct Entry {
    const void* buffer;
    Event read{false};
    bool pending = false;
  };
  const Entry* find(const void* buffer) const;
  Entry* find(const void* buffer);
  std::vector<Entry> entries_;
};
