#include "agent/cgroups.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/executor_util.h"

namespace gpufleet::agent {

using executor_internal::ErrnoText;
using executor_internal::ReadFileToString;
using executor_internal::WriteKernelFile;

std::string_view CgroupModeName(CgroupMode mode) {
  switch (mode) {
    case CgroupMode::kAuto:
      return "auto";
    case CgroupMode::kV2:
      return "v2";
    case CgroupMode::kV1:
      return "v1";
    case CgroupMode::kNone:
      return "none";
  }
  return "?";
}

std::optional<CgroupMode> ParseCgroupMode(std::string_view name) {
  for (CgroupMode mode : {CgroupMode::kAuto, CgroupMode::kV2, CgroupMode::kV1, CgroupMode::kNone})
    if (CgroupModeName(mode) == name) return mode;
  return std::nullopt;
}

std::string_view CgroupVersionName(CgroupVersion version) {
  switch (version) {
    case CgroupVersion::kNone:
      return "none";
    case CgroupVersion::kV1:
      return "v1";
    case CgroupVersion::kV2:
      return "v2";
  }
  return "?";
}

std::optional<CgroupVersion> ParseCgroupVersion(std::string_view name) {
  for (CgroupVersion version : {CgroupVersion::kNone, CgroupVersion::kV1, CgroupVersion::kV2})
    if (CgroupVersionName(version) == name) return version;
  return std::nullopt;
}

int64_t CpuQuotaUs(MilliCpu cpu_milli) {
  constexpr int64_t kMinQuotaUs = 1000;  // the kernel rejects less
  return std::max(kMinQuotaUs, cpu_milli * kCpuPeriodUs / 1000);
}

namespace {

constexpr int64_t kBytesPerMiB = int64_t{1} << 20;

struct CgroupMount {
  std::string mount_point;
  std::string fstype;                // "cgroup" (v1) or "cgroup2"
  std::vector<std::string> options;  // v1: the controllers among the super options
};

std::vector<std::string> Split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(separator, begin);
    if (end == std::string_view::npos) end = text.size();
    if (end > begin) parts.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

bool Contains(const std::vector<std::string>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string UnescapeMountPath(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 4 <= text.size()) {
      int value = 0;
      auto result = std::from_chars(text.data() + i + 1, text.data() + i + 4, value, 8);
      if (result.ec == std::errc() && result.ptr == text.data() + i + 4) {
        out.push_back(static_cast<char>(value));
        i += 3;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

std::vector<CgroupMount> ReadCgroupMounts(const std::string& mountinfo_path) {
  std::vector<CgroupMount> mounts;
  auto text = ReadFileToString(mountinfo_path);
  if (!text) return mounts;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::vector<std::string> fields = Split(line, ' ');
    auto separator = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || separator == fields.end() || fields.end() - separator < 4) continue;
    CgroupMount mount;
    mount.fstype = *(separator + 1);
    if (mount.fstype != "cgroup" && mount.fstype != "cgroup2") continue;
    mount.mount_point = UnescapeMountPath(fields[4]);
    mount.options = Split(*(separator + 3), ',');
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

// mkdir that accepts an existing directory.
std::optional<std::string> EnsureDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return std::nullopt;
  return fmt::format("mkdir '{}': {}", path, ErrnoText(errno));
}

// Enables `controllers` for the children of `dir` where they are not already.
std::optional<std::string> EnableControllers(const std::string& dir,
                                             const std::vector<std::string>& controllers) {
  std::string file = dir + "/cgroup.subtree_control";
  auto enabled = ReadFileToString(file);
  if (!enabled) return fmt::format("read '{}': {}", file, ErrnoText(errno));
  std::vector<std::string> present = Split(Trim(*enabled), ' ');
  for (const std::string& controller : controllers) {
    if (Contains(present, controller)) continue;
    if (auto error = WriteKernelFile(file, "+" + controller)) return error;
  }
  return std::nullopt;
}

// Creates and removes a scratch child of each parent, writing the given files, to learn whether
// workloads' cgroups can be made here.
std::optional<std::string> ProbeChild(
    const std::string& parent, const std::vector<std::pair<std::string, std::string>>& writes) {
  // A leading '.' never collides with a workload id (ids may not start with one).
  std::string probe = fmt::format("{}/.probe-{}", parent, ::getpid());
  if (::mkdir(probe.c_str(), 0755) != 0 && errno != EEXIST)
    return fmt::format("mkdir '{}': {}", probe, ErrnoText(errno));
  std::optional<std::string> error;
  for (const auto& [file, value] : writes) {
    error = WriteKernelFile(probe + "/" + file, value);
    if (error) break;
  }
  ::rmdir(probe.c_str());
  return error;
}

std::optional<std::string> ValidateParent(const std::string& parent) {
  if (parent.empty() || parent[0] == '/')
    return "the cgroup parent must be a non-empty relative path";
  for (const std::string& part : Split(parent, '/'))
    if (part == "." || part == "..")
      return fmt::format("the cgroup parent '{}' has '.' or '..'", parent);
  return std::nullopt;
}

std::optional<std::string> ProbeV2(const std::vector<CgroupMount>& mounts,
                                   const std::string& parent,
                                   std::vector<std::string>& parent_dirs) {
  auto mount = std::find_if(mounts.begin(), mounts.end(),
                            [](const CgroupMount& m) { return m.fstype == "cgroup2"; });
  if (mount == mounts.end()) return "cgroup v2: no cgroup2 mount";
  const std::string& root = mount->mount_point;
  auto available = ReadFileToString(root + "/cgroup.controllers");
  if (!available)
    return fmt::format("cgroup v2: read '{}/cgroup.controllers': {}", root, ErrnoText(errno));
  std::vector<std::string> controllers = Split(Trim(*available), ' ');
  if (!Contains(controllers, "cpu") || !Contains(controllers, "memory"))
    return fmt::format(
        "cgroup v2 at {}: the cpu and memory controllers are not available there "
        "(cgroup.controllers: '{}')",
        root, Trim(*available));
  // Each level down to the parent must pass the controllers on to its children.
  const std::vector<std::string> wanted = {"cpu", "memory"};
  std::string dir = root;
  for (const std::string& part : Split(parent, '/')) {
    if (auto error = EnableControllers(dir, wanted)) return "cgroup v2: " + *error;
    dir += "/" + part;
    if (auto error = EnsureDir(dir)) return "cgroup v2: " + *error;
  }
  if (auto error = EnableControllers(dir, wanted)) return "cgroup v2: " + *error;
  if (auto error = ProbeChild(
          dir, {{"cpu.max", fmt::format("max {}", kCpuPeriodUs)}, {"memory.max", "max"}}))
    return "cgroup v2: " + *error;
  parent_dirs = {dir};
  return std::nullopt;
}

std::optional<std::string> ProbeV1(const std::vector<CgroupMount>& mounts,
                                   const std::string& parent,
                                   std::vector<std::string>& parent_dirs) {
  std::vector<std::string> dirs;
  for (const char* controller : {"cpu", "memory"}) {
    auto mount = std::find_if(mounts.begin(), mounts.end(), [&](const CgroupMount& m) {
      return m.fstype == "cgroup" && Contains(m.options, controller);
    });
    if (mount == mounts.end())
      return fmt::format("cgroup v1: no hierarchy with the {} controller", controller);
    std::string dir = mount->mount_point;
    for (const std::string& part : Split(parent, '/')) {
      dir += "/" + part;
      if (auto error = EnsureDir(dir)) return "cgroup v1: " + *error;
    }
    std::vector<std::pair<std::string, std::string>> writes;
    if (std::string_view(controller) == "cpu")
      writes = {{"cpu.cfs_quota_us", "-1"}};
    else
      writes = {{"memory.limit_in_bytes", "-1"}};
    if (auto error = ProbeChild(dir, writes)) return "cgroup v1: " + *error;
    dirs.push_back(dir);
  }
  parent_dirs = dirs;
  return std::nullopt;
}

}  // namespace

CgroupManager CgroupManager::Detect(const CgroupProbeOptions& options) {
  CgroupManager manager;
  if (options.mode == CgroupMode::kNone) return manager;
  if (auto error = ValidateParent(options.parent)) {
    manager.warning_ = *error + "; running workloads without cpu/memory limits";
    return manager;
  }
  std::vector<CgroupMount> mounts = ReadCgroupMounts(options.mountinfo_path);
  std::vector<std::string> reasons;
  if (options.mode == CgroupMode::kAuto || options.mode == CgroupMode::kV2) {
    auto error = ProbeV2(mounts, options.parent, manager.parent_dirs_);
    if (!error) {
      manager.version_ = CgroupVersion::kV2;
      return manager;
    }
    reasons.push_back(*error);
  }
  if (options.mode == CgroupMode::kAuto || options.mode == CgroupMode::kV1) {
    auto error = ProbeV1(mounts, options.parent, manager.parent_dirs_);
    if (!error) {
      manager.version_ = CgroupVersion::kV1;
      return manager;
    }
    reasons.push_back(*error);
  }
  manager.parent_dirs_.clear();
  manager.warning_ = fmt::format(
      "no usable cgroups (mode {}): {}; running workloads without "
      "cpu/memory limits",
      CgroupModeName(options.mode), fmt::join(reasons, "; "));
  return manager;
}

std::optional<std::string> CgroupManager::Create(const std::string& name,
                                                 const CgroupLimits& limits,
                                                 WorkloadCgroup& cgroup) const {
  cgroup = WorkloadCgroup{};
  if (version_ == CgroupVersion::kNone) return "cgroups are not in use";
  WorkloadCgroup created{version_, {}};
  for (const std::string& parent : parent_dirs_) {
    std::string dir = parent + "/" + name;
    // A leftover from an earlier workload of this name is reused only once it is empty.
    if (::mkdir(dir.c_str(), 0755) != 0 &&
        !(errno == EEXIST && ::rmdir(dir.c_str()) == 0 && ::mkdir(dir.c_str(), 0755) == 0)) {
      std::string error = fmt::format("mkdir '{}': {}", dir, ErrnoText(errno));
      RemoveCgroup(created);
      return error;
    }
    created.dirs.push_back(dir);
  }
  std::vector<std::pair<std::string, std::string>> writes;
  const std::string quota =
      limits.cpu_milli > 0 ? std::to_string(CpuQuotaUs(limits.cpu_milli)) : std::string();
  const std::string memory =
      limits.memory_mib > 0 ? std::to_string(limits.memory_mib * kBytesPerMiB) : std::string();
  if (version_ == CgroupVersion::kV2) {
    const std::string& dir = created.dirs[0];
    writes.emplace_back(dir + "/cpu.max",
                        fmt::format("{} {}", quota.empty() ? "max" : quota, kCpuPeriodUs));
    writes.emplace_back(dir + "/memory.max", memory.empty() ? "max" : memory);
  } else {
    writes.emplace_back(created.dirs[0] + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
    writes.emplace_back(created.dirs[0] + "/cpu.cfs_quota_us", quota.empty() ? "-1" : quota);
    writes.emplace_back(created.dirs[1] + "/memory.limit_in_bytes", memory.empty() ? "-1" : memory);
  }
  for (const auto& [file, value] : writes) {
    if (auto error = WriteKernelFile(file, value)) {
      RemoveCgroup(created);
      return error;
    }
  }
  cgroup = std::move(created);
  return std::nullopt;
}

std::vector<std::string> CgroupProcsFiles(const WorkloadCgroup& cgroup) {
  std::vector<std::string> files;
  for (const std::string& dir : cgroup.dirs)
    files.push_back(dir + "/cgroup.procs");
  return files;
}

std::vector<int32_t> CgroupMembers(const WorkloadCgroup& cgroup) {
  std::vector<int32_t> pids;
  for (const std::string& file : CgroupProcsFiles(cgroup)) {
    auto text = ReadFileToString(file);
    if (!text) continue;
    for (const std::string& line : Split(*text, '\n')) {
      int32_t pid = 0;
      if (std::from_chars(line.data(), line.data() + line.size(), pid).ec == std::errc() &&
          std::find(pids.begin(), pids.end(), pid) == pids.end())
        pids.push_back(pid);
    }
  }
  return pids;
}

std::optional<int64_t> CgroupOomKills(const WorkloadCgroup& cgroup) {
  if (cgroup.dirs.empty()) return std::nullopt;
  // v2 memory.events and v1 memory.oom_control both have an "oom_kill N" line.
  const std::string file =
      cgroup.dirs.back() +
      (cgroup.version == CgroupVersion::kV2 ? "/memory.events" : "/memory.oom_control");
  auto text = ReadFileToString(file);
  if (!text) return std::nullopt;
  for (const std::string& line : Split(*text, '\n')) {
    std::vector<std::string> words = Split(line, ' ');
    int64_t count = 0;
    if (words.size() == 2 && words[0] == "oom_kill" &&
        std::from_chars(words[1].data(), words[1].data() + words[1].size(), count).ec ==
            std::errc())
      return count;
  }
  return std::nullopt;
}

bool CgroupExists(const WorkloadCgroup& cgroup) {
  for (const std::string& dir : cgroup.dirs)
    if (::access(dir.c_str(), F_OK) == 0) return true;
  return false;
}

std::optional<std::string> RemoveCgroup(const WorkloadCgroup& cgroup) {
  constexpr int kAttempts = 100;
  constexpr auto kPause = std::chrono::milliseconds(10);
  std::vector<std::string> failures;
  for (const std::string& dir : cgroup.dirs) {
    for (int attempt = 0;; ++attempt) {
      if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) break;
      // EBUSY while killed processes are still leaving.
      if (errno != EBUSY || attempt + 1 == kAttempts) {
        failures.push_back(fmt::format("rmdir '{}': {}", dir, ErrnoText(errno)));
        break;
      }
      std::this_thread::sleep_for(kPause);
    }
  }
  if (failures.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(failures, "; "));
}

}  // namespace gpufleet::agent
