#include "agent/workload.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace gpufleet::agent {
namespace {

constexpr size_t kMaxIdLength = 128;
constexpr MiB kMaxMemoryMib = MiB{1} << 30;  // 1 PiB: keeps the byte count far from overflow

bool HasNul(const std::string& text) {
  return text.find('\0') != std::string::npos;
}

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

}  // namespace

std::string_view WorkloadStateName(WorkloadState state) {
  switch (state) {
    case WorkloadState::kStarting:
      return "starting";
    case WorkloadState::kRunning:
      return "running";
    case WorkloadState::kExited:
      return "exited";
    case WorkloadState::kFailedToStart:
      return "failed_to_start";
    case WorkloadState::kLost:
      return "lost";
  }
  return "?";
}

std::optional<WorkloadState> ParseWorkloadState(std::string_view name) {
  for (WorkloadState state :
       {WorkloadState::kStarting, WorkloadState::kRunning, WorkloadState::kExited,
        WorkloadState::kFailedToStart, WorkloadState::kLost})
    if (WorkloadStateName(state) == name) return state;
  return std::nullopt;
}

std::optional<std::string> ValidateWorkloadSpec(const WorkloadSpec& spec) {
  // The id names a directory and a cgroup, so it must be a plain, safe file name.
  if (spec.id.empty() || spec.id.size() > kMaxIdLength)
    return fmt::format("workload id must have 1 to {} characters", kMaxIdLength);
  if (spec.id[0] == '.' || !std::all_of(spec.id.begin(), spec.id.end(), IsIdChar))
    return fmt::format("workload id '{}' may only use A-Z a-z 0-9 _ - . and may not start with '.'",
                       spec.id);
  if (spec.argv.empty() || spec.argv[0].empty()) return "argv is empty: no command to run";
  for (const std::string& arg : spec.argv)
    if (HasNul(arg)) return "an argv entry holds a NUL character";
  for (const auto& [key, value] : spec.env) {
    if (key.empty() || key.find('=') != std::string::npos || HasNul(key))
      return fmt::format("environment name '{}' is empty or holds '=' or NUL", key);
    if (HasNul(value)) return fmt::format("environment value of '{}' holds a NUL character", key);
  }
  if (!spec.workdir.empty() && (spec.workdir[0] != '/' || HasNul(spec.workdir)))
    return fmt::format("workdir '{}' is not an absolute path", spec.workdir);
  std::set<int32_t> seen;
  for (int32_t index : spec.gpu_indices) {
    if (index < 0) return fmt::format("GPU index {} is negative", index);
    if (!seen.insert(index).second) return fmt::format("GPU index {} is listed twice", index);
  }
  if (spec.gpu_milli <= 0 || spec.gpu_milli > kMilliPerGpu)
    return fmt::format("a GPU share must be 1..1000 thousandths of a GPU, not {}", spec.gpu_milli);
  if (!spec.gpu_uuids.empty() && spec.gpu_uuids.size() != spec.gpu_indices.size())
    return fmt::format("{} GPU UUIDs for {} GPU indices", spec.gpu_uuids.size(),
                       spec.gpu_indices.size());
  for (const std::string& uuid : spec.gpu_uuids)
    if (uuid.empty() || uuid.find(',') != std::string::npos || HasNul(uuid))
      return fmt::format("GPU UUID '{}' is empty or holds ','", uuid);
  if (spec.cpu_milli < 0) return fmt::format("cpu_milli {} is negative", spec.cpu_milli);
  if (spec.memory_mib < 0 || spec.memory_mib > kMaxMemoryMib)
    return fmt::format("memory_mib {} is outside 0..{}", spec.memory_mib, kMaxMemoryMib);
  if (spec.grace_period < 0)
    return fmt::format("grace period {} ms is negative", spec.grace_period);
  if (spec.max_runtime < 0) return fmt::format("max runtime {} ms is negative", spec.max_runtime);
  if (auto error = ValidateLogLimits(spec.logs)) return "logs: " + *error;
  for (const auto* paths : {&spec.isolation.hidden_devices, &spec.isolation.keep_visible})
    for (const std::string& path : *paths)
      if (path.empty() || path[0] != '/' || HasNul(path) || path.find("/../") != std::string::npos)
        return fmt::format("isolation path '{}' is not a plain absolute path", path);
  if (!spec.isolation.mount_namespace && spec.container.image.empty() &&
      !(spec.isolation.hidden_devices.empty() && spec.isolation.keep_visible.empty()))
    return "hidden devices and kept paths need a mount namespace";
  if (auto error = ValidateContainerSpec(spec.container)) return *error;
  if (spec.container.image.empty() && !spec.cdi_devices.empty())
    return "CDI devices are given to containers only";
  return std::nullopt;
}

}  // namespace gpufleet::agent
