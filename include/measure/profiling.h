// NVTX ranges for the phases of a step, coloured as in the seed posts, and the steady-state window.
//
// Every range goes to NVTX (nsys shows it) and, while a built-in trace is recording, to the trace's
// host-range list too (trace.h), so both timelines show the same phases.
#pragma once

#include <cstdint>
#include <string>

namespace phase_color {
constexpr uint32_t kRed = 0xFFE53935;     // get batch
constexpr uint32_t kYellow = 0xFFFDD835;  // copy batch
constexpr uint32_t kGreen = 0xFF43A047;   // forward
constexpr uint32_t kPurple = 0xFF8E24AA;  // backward
constexpr uint32_t kBlue = 0xFF1E88E5;    // optimizer step
constexpr uint32_t kCyan = 0xFF00ACC1;    // loss stats
constexpr uint32_t kTeal = 0xFF00897B;    // step graph: forward to optimizer step as one CUDA graph launch
constexpr uint32_t kGrey = 0xFF9E9E9E;    // step N, evaluation, loader work
}  // namespace phase_color

class NvtxRange {
 public:
  NvtxRange(const char* name, uint32_t argb);
  NvtxRange(const std::string& name, uint32_t argb) : NvtxRange(name.c_str(), argb) {}
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  std::string name_;
  uint32_t argb_;
  uint64_t start_ns_ = 0;
  bool recording_ = false;
};

// Names the calling thread in nsys and in the built-in trace ("main", "loader 0", ...).
void name_this_thread(const char* name);
