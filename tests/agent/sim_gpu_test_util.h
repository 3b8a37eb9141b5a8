#pragma once

// Small builders for the simulated-GPU tests. (Designated initializers that skip fields trip
// GCC 12's -Wmissing-field-initializers, hence functions.)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agent/sim_gpu_backend.h"

namespace gpufleet::agent {

inline constexpr TimeMs kSecond = 1000;

inline SimGpuLoad Load(double utilization, MiB memory_used_mib = 0,
                       std::vector<int32_t> process_ids = {}) {
  SimGpuLoad load;
  load.utilization = utilization;
  load.memory_used_mib = memory_used_mib;
  load.process_ids = std::move(process_ids);
  return load;
}

inline SimOptions Options(std::string uuid_namespace, uint64_t seed = 1) {
  SimOptions options;
  options.uuid_namespace = std::move(uuid_namespace);
  options.seed = seed;
  return options;
}

}  // namespace gpufleet::agent
