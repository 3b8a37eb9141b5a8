#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/types.h"

namespace gpufleet {

struct Gpu {
  std::string uuid;
  std::string model;  // e.g. "H100-80GB", "V100M32"; matched exactly by job constraints
  MiB memory_mib = 0;
  int32_t index = 0;          // index on its node, as CUDA/NVML number it
  int32_t nvlink_island = 0;  // GPUs with the same island id share an NVLink/NVSwitch domain
  bool healthy = true;
};

// A machine. Nodes are grouped in a two-level network tree: node -> rack (leaf switch) -> spine.
struct Node {
  std::string name;
  std::string rack;
  std::string spine;
  MilliCpu cpu_milli = 0;
  MiB memory_mib = 0;
  std::vector<Gpu> gpus;
  bool schedulable = true;  // false while drained or lost
};

struct Cluster {
  std::vector<Node> nodes;

  int64_t TotalGpus() const;
  // Healthy GPUs on schedulable nodes: what the scheduler may hand out.
  int64_t UsableGpus() const;
};

// Shape of a uniform cluster, as `gpufleet sim --nodes 64 --gpus-per-node 8` describes it.
struct UniformClusterShape {
  int32_t nodes = 64;
  int32_t gpus_per_node = 8;
  int32_t nodes_per_rack = 16;
  int32_t racks_per_spine = 8;
  int32_t gpus_per_nvlink_island = 8;
  std::string gpu_model = "H100-80GB";
  MiB gpu_memory_mib = 81559;
  MilliCpu cpu_milli_per_node = 128'000;
  MiB memory_mib_per_node = 1'048'576;
};

Cluster MakeUniformCluster(const UniformClusterShape& shape);

// Returns a description of the first inconsistency (duplicate node name, GPU index out of
// order, negative capacity), or nothing when the cluster is well formed.
std::optional<std::string> ValidateCluster(const Cluster& cluster);

}  // namespace gpufleet
