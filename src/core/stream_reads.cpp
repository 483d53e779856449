// The pending reads of core/stream_reads.h.
#include "core/stream_reads.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/errors.h"

StreamReads::StreamReads(const std::vector<const void*>& buffers) {
  entries_.reserve(buffers.size());
  for (const void* b : buffers) entries_.push_back(Entry{b});
}

const StreamReads::Entry* StreamReads::find(const void* buffer) const {
  const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.buffer == buffer; });
  return it == entries_.end() ? nullptr : &*it;
}

StreamReads::Entry* StreamReads::find(const void* buffer) {
  return const_cast<Entry*>(std::as_const(*this).find(buffer));
}

void StreamReads::read(const void* buffer, cudaStream_t reader) {
  Entry* e = buffer ? find(buffer) : nullptr;
  if (!e) throw Fatal("internal error: StreamReads::read of a buffer it does not track");
  e->read.record(reader);
  e->pending = true;
}

void StreamReads::before_write(const void* buffer, cudaStream_t writer) {
  Entry* e = find(buffer);
  if (!e || !e->pending) return;
  CUDA_CHECK(cudaStreamWaitEvent(writer, e->read, 0));
  e->pending = false;
}

void StreamReads::reset() {
  for (Entry& e : entries_) e.pending = false;
}

bool StreamReads::pending(const void* buffer) const {
  const Entry* e = find(buffer);
  return e && e->pending;
}
