// The two schedules of our resident 1x1 conv kernels (kernels/conv1x1_stats_kernel.cuh): each
// consumer warpgroup on every other tile, their mainloops by turns, so that one's epilogue runs
// beside the other's mainloop (PingPong), or both on each tile, 64 rows each (Cooperative), which
// leaves one staging and side buffer and so more shared memory to the stages.
#pragma once

enum class Conv1x1Schedule { PingPong, Cooperative };
