#pragma once

#include <cstdint>

namespace gpufleet {

// Exact integer quantities: fractions of a GPU are milli-GPUs, so 0.5 GPU is 500 and
// arithmetic on allocations never rounds.
using MilliGpu = int32_t;
inline constexpr MilliGpu kMilliPerGpu = 1000;
using MilliCpu = int64_t;
using MiB = int64_t;

// Time is integer milliseconds on whatever clock the caller uses (wall clock in the server,
// trace time in the simulator). The scheduling core never reads a clock itself.
using TimeMs = int64_t;
inline constexpr TimeMs kMsPerSecond = 1000;

using JobId = uint64_t;

}  // namespace gpufleet
