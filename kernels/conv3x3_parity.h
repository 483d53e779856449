// The data gradient of a 3x3 stride-2 conv with a pad of 1 (the first conv2 of layers 2-4) split by
// the parity of dx's pixel. The forward reads x[2p + r - 1] at output row p and filter row r, so
// dx's even rows 2i take dy's row i by r = 1 alone, and its odd rows 2i + 1 take dy's row i + 1 by
// r = 0 and row i by r = 2; the columns likewise. Each of the four phases (a, b) of dx[2i + a][2j + b]
// is then a stride-1 conv of dy with 1, 2, 2 or 4 taps, 9 in all, none of them a zero: what cuDNN's
// strided data gradient computes with its zeros skipped by index (kernels/conv3x3_stride2.h).
//
// Phase a * 2 + b. A tap: dy read at [i + dr][j + ds] by the filter's (r, s). The taps of the four
// phases, in order, are the 9 of the phases' filter (conv3x3_stride2_phase_filter).
#pragma once

struct ParityTap {
  int dr, ds;  // dy's row and column offset from (i, j): 0 or 1
  int r, s;    // the forward filter's tap
};

__host__ __device__ constexpr int parity_taps(int phase) { return (1 + (phase >> 1)) * (1 + (phase & 1)); }

// The phase's first tap among the 9: phases 0-3 take taps [0, 1), [1, 3), [3, 5), [5, 9).
__host__ __device__ constexpr int parity_first_tap(int phase) { return phase == 0 ? 0 : phase == 1 ? 1 : phase == 2 ? 3 : 5; }

// Tap `tap` of phase `phase` (0 <= tap < parity_taps(phase)): along an odd axis first the next
// pixel of dy by the filter's 0, then the same pixel by its 2; along an even axis the same pixel by 1.
__host__ __device__ constexpr ParityTap parity_tap(int phase, int tap) {
  const int a = phase >> 1, b = phase & 1;
  const int ri = tap / (1 + b), si = tap % (1 + b);
  return {a && ri == 0 ? 1 : 0, b && si == 0 ? 1 : 0, a ? (ri == 0 ? 0 : 2) : 1, b ? (si == 0 ? 0 : 2) : 1};
}
