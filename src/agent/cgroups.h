#pragma once

// CPU and memory limits through cgroups: v2 (one directory per workload under a parent with the
// cpu and memory controllers enabled) or v1 (one directory per controller). Detect() probes what
// this machine allows once, at agent start.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::agent {

enum class CgroupMode { kAuto, kV2, kV1, kNone };  // what the operator asks for
enum class CgroupVersion { kNone, kV1, kV2 };      // what is in use

std::string_view CgroupModeName(CgroupMode mode);  // "auto", "v2", "v1", "none"
std::optional<CgroupMode> ParseCgroupMode(std::string_view name);
std::string_view CgroupVersionName(CgroupVersion version);  // "none", "v1", "v2"
std::optional<CgroupVersion> ParseCgroupVersion(std::string_view name);

struct CgroupLimits {
  MilliCpu cpu_milli = 0;  // 0 = unlimited
  MiB memory_mib = 0;      // 0 = unlimited
};

// One workload's cgroup.
struct WorkloadCgroup {
  CgroupVersion version = CgroupVersion::kNone;
  std::vector<std::string> dirs;  // v2: {dir}; v1: {cpu dir, memory dir}
};

struct CgroupProbeOptions {
  CgroupMode mode = CgroupMode::kAuto;
  // Relative to the root of each hierarchy: workloads get <root>/<parent>/<workload id>.
  std::string parent = "gpufleet";
  std::string mountinfo_path = "/proc/self/mountinfo";  // tests substitute their own
};

class CgroupManager {
 public:
  // Picks v2 when its cpu and memory controllers can be enabled under the parent, else v1 when its
  // cpu and memory hierarchies are writable (kAuto); kV2/kV1 try only that one. When nothing is
  // usable the version is kNone and warning() says why (empty when kNone was asked for).
  static CgroupManager Detect(const CgroupProbeOptions& options);

  CgroupVersion version() const { return version_; }
  const std::string& warning() const { return warning_; }
  const std::vector<std::string>& parent_dirs() const { return parent_dirs_; }

  // Creates the workload's cgroup and writes its limits. On failure returns why and leaves no
  // directory behind.
  std::optional<std::string> Create(const std::string& name, const CgroupLimits& limits,
                                    WorkloadCgroup& cgroup) const;

 private:
  CgroupVersion version_ = CgroupVersion::kNone;
  std::vector<std::string> parent_dirs_;  // v2: {parent}; v1: {cpu parent, memory parent}
  std::string warning_;
};

// The cgroup.procs files a process writes "0" into to join the cgroup.
std::vector<std::string> CgroupProcsFiles(const WorkloadCgroup& cgroup);
// Pids in any of the cgroup's directories (no duplicates).
std::vector<int32_t> CgroupMembers(const WorkloadCgroup& cgroup);
// OOM kills recorded for the cgroup, or nothing when the kernel does not say.
std::optional<int64_t> CgroupOomKills(const WorkloadCgroup& cgroup);
bool CgroupExists(const WorkloadCgroup& cgroup);
// Removes the directories, waiting up to about a second for exiting processes to leave them.
// Missing directories are fine.
std::optional<std::string> RemoveCgroup(const WorkloadCgroup& cgroup);

// The CFS numbers for a CPU limit: period 100 ms, quota at least 1 ms.
inline constexpr int64_t kCpuPeriodUs = 100'000;
int64_t CpuQuotaUs(MilliCpu cpu_milli);

}  // namespace gpufleet::agent
