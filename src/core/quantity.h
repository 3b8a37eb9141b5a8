#pragma once

// Quantities as people write them: "16Gi" of memory, "500m" of CPU, "30s". The API, the CLI and
// the agent all read them the same way.

#include <optional>
#include <string_view>

#include "core/types.h"

namespace gpufleet {

// "512Mi", "2Gi", "1024" (MiB), "1.5Gi"; nothing when malformed.
std::optional<MiB> ParseMemoryMib(std::string_view text);
// "0.5" (cores), "500m", "2"; nothing when malformed.
std::optional<MilliCpu> ParseCpuMilli(std::string_view text);
// "30s", "500ms", "2m", "1h", "7d", "1.5s", "10" (seconds); nothing when malformed.
std::optional<TimeMs> ParseDurationMs(std::string_view text);
// "0.5", "1", "8": GPUs per task in milli-GPUs; nothing when malformed or not a multiple of
// 1/1000.
std::optional<MilliGpu> ParseGpuMilli(std::string_view text);

}  // namespace gpufleet
