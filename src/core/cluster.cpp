#include "core/cluster.h"

#include <unordered_set>

#include <fmt/format.h>

namespace gpufleet {

int64_t Cluster::TotalGpus() const {
  int64_t total = 0;
  for (const Node& node : nodes)
    total += static_cast<int64_t>(node.gpus.size());
  return total;
}

int64_t Cluster::UsableGpus() const {
  int64_t total = 0;
  for (const Node& node : nodes) {
    if (!node.schedulable) continue;
    for (const Gpu& gpu : node.gpus)
      total += gpu.healthy ? 1 : 0;
  }
  return total;
}

Cluster MakeUniformCluster(const UniformClusterShape& shape) {
  Cluster cluster;
  cluster.nodes.reserve(static_cast<size_t>(shape.nodes));
  const int32_t per_rack = std::max(1, shape.nodes_per_rack);
  const int32_t per_spine = std::max(1, shape.racks_per_spine);
  const int32_t per_island = std::max(1, shape.gpus_per_nvlink_island);
  for (int32_t n = 0; n < shape.nodes; ++n) {
    Node node;
    node.name = fmt::format("node-{:04d}", n);
    const int32_t rack = n / per_rack;
    node.rack = fmt::format("rack-{:03d}", rack);
    node.spine = fmt::format("spine-{:02d}", rack / per_spine);
    node.cpu_milli = shape.cpu_milli_per_node;
    node.memory_mib = shape.memory_mib_per_node;
    for (int32_t g = 0; g < shape.gpus_per_node; ++g) {
      node.gpus.push_back(Gpu{.uuid = fmt::format("GPU-sim-{:04d}-{:02d}", n, g),
                              .model = shape.gpu_model,
                              .memory_mib = shape.gpu_memory_mib,
                              .index = g,
                              .nvlink_island = g / per_island,
                              .healthy = true});
    }
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

std::optional<std::string> ValidateCluster(const Cluster& cluster) {
  std::unordered_set<std::string> names;
  for (const Node& node : cluster.nodes) {
    if (node.name.empty()) return "a node has no name";
    if (!names.insert(node.name).second) return fmt::format("duplicate node name '{}'", node.name);
    if (node.cpu_milli < 0 || node.memory_mib < 0)
      return fmt::format("node '{}' has negative CPU or memory", node.name);
    for (size_t i = 0; i < node.gpus.size(); ++i) {
      const Gpu& gpu = node.gpus[i];
      if (gpu.index != static_cast<int32_t>(i))
        return fmt::format("node '{}': GPU at position {} has index {}", node.name, i, gpu.index);
      if (gpu.memory_mib < 0)
        return fmt::format("node '{}': GPU {} has negative memory", node.name, i);
    }
  }
  return std::nullopt;
}

}  // namespace gpufleet
