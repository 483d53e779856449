// Owning buffers: device memory and pinned host memory (RAII, move-only).
//
// Both are one template over where the memory lives. Every allocation carries a label, so that
// running out of memory names what was being allocated, how much, and how much the GPU had free.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "core/format.h"  // format_bytes, which the allocation messages use

// Where a Buffer's memory comes from: allocate() throws a Fatal naming `what`; release() never throws.
struct DeviceMemory {
  static void* allocate(size_t bytes, const std::string& what);
  static void release(void* p);
};
struct PinnedHostMemory {
  static void* allocate(size_t bytes, const std::string& what);
  static void release(void* p);
};

template <class Memory>
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, const std::string& what)
      : ptr_(bytes ? Memory::allocate(bytes, what) : nullptr), bytes_(bytes) {}
  ~Buffer() {
    if (ptr_) Memory::release(ptr_);
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) Memory::release(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = Buffer<DeviceMemory>;
using PinnedBuffer = Buffer<PinnedHostMemory>;

// Device memory to time kernels on when autotuning: every byte 0x3C (about 1.06 in fp16, 0.0115 in
// fp32), never zeros, which can time faster than real data. Empty for 0 bytes.
DeviceBuffer scratch_buffer(size_t bytes, const std::string& what);
