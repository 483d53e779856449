// Random numbers that are reproducible across threads and resumable from a checkpoint.
//
// Everything random in a run (weight init, epoch order, crop offsets, flips, synthetic images) is a
// pure function of (seed, a few counters) through SplitMix64, so a worker thread can compute the
// augmentation of sample i of batch k without any shared state, and a resumed run needs only the
// seed and the step to continue exactly where it stopped.
#pragma once

#include <cmath>
#include <cstdint>

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A hash of several counters; different argument orders give unrelated values.
inline uint64_t mix(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632BE59BD9B4E019ull)); }
inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(a, b), c); }

// Uniform in [0, 1) from the top 53 bits.
inline double to_unit(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

// A small sequential generator (SplitMix64 stream) for host-side loops.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_++); }
  double uniform() { return to_unit(next()); }
  // Unbiased integer in [0, n) (Lemire's multiply-shift with rejection).
  uint32_t below(uint32_t n) {
    uint64_t m = static_cast<uint64_t>(static_cast<uint32_t>(next())) * n;
    uint32_t low = static_cast<uint32_t>(m);
    if (low < n) {
      const uint32_t threshold = (0u - n) % n;
      while (low < threshold) {
        m = static_cast<uint64_t>(static_cast<uint32_t>(next())) * n;
        low = static_cast<uint32_t>(m);
      }
    }
    return static_cast<uint32_t>(m >> 32);
  }
  // Standard normal (Box-Muller, one value per call).
  double normal() {
    double u1 = uniform();
    const double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};
