#pragma once

// Internal to src/sched: the part of a job spec placement depends on, as a hash key.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/job.h"

namespace gpufleet::sched {

// Everything placement depends on; jobs of one shape fit or fail together within a cycle.
struct Shape {
  const JobSpec* spec;
  bool operator==(const Shape& other) const {
    const JobSpec& a = *spec;
    const JobSpec& b = *other.spec;
    return a.tasks == b.tasks && a.tasks_per_node == b.tasks_per_node &&
           a.gpu_milli_per_task == b.gpu_milli_per_task &&
           a.cpu_milli_per_task == b.cpu_milli_per_task &&
           a.memory_mib_per_task == b.memory_mib_per_task &&
           a.min_gpu_memory_mib == b.min_gpu_memory_mib && a.gpu_models == b.gpu_models;
  }
};

struct ShapeHash {
  size_t operator()(const Shape& shape) const {
    const JobSpec& s = *shape.spec;
    size_t h = std::hash<int64_t>{}(s.tasks);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<int64_t>{}(s.tasks_per_node));
    mix(std::hash<int64_t>{}(s.gpu_milli_per_task));
    mix(std::hash<int64_t>{}(s.cpu_milli_per_task));
    mix(std::hash<int64_t>{}(s.memory_mib_per_task));
    mix(std::hash<int64_t>{}(s.min_gpu_memory_mib));
    for (const std::string& model : s.gpu_models)
      mix(std::hash<std::string>{}(model));
    return h;
  }
};

}  // namespace gpufleet::sched
