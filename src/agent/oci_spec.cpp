#include "agent/oci_spec.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <yaml-cpp/yaml.h>

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ContainerPathOf(const std::string& host_path) {
  if (host_path.rfind("/dev/", 0) == 0) return host_path;
  return "/dev/" + fs::path(host_path).filename().string();
}

json DeviceNodeJson(const std::string& host_path) {
  json node = {{"path", ContainerPathOf(host_path)}};
  if (node["path"] != host_path) node["hostPath"] = host_path;
  return node;
}

// One spec file's edits, as a tree of strings: yaml-cpp reads JSON specs too.
struct SpecEdits {
  YAML::Node common;
  std::map<std::string, YAML::Node> devices;  // name -> containerEdits
  std::string file;
};

std::optional<std::string> AddEdits(const YAML::Node& edits, const std::string& file, CdiEdits& out,
                                    json& hooks) {
  if (!edits || !edits.IsMap()) return std::nullopt;
  try {
    if (const YAML::Node env = edits["env"])
      for (const YAML::Node& entry : env)
        out.env.push_back(entry.as<std::string>());
    if (const YAML::Node nodes = edits["deviceNodes"]) {
      for (const YAML::Node& node : nodes) {
        ContainerDevice device;
        device.path = node["path"].as<std::string>();
        device.host_path = node["hostPath"] ? node["hostPath"].as<std::string>() : device.path;
        struct stat info {};
        if (::stat(device.host_path.c_str(), &info) != 0)
          return fmt::format("CDI spec {}: device node {}: {}", file, device.host_path,
                             std::strerror(errno));
        if (!S_ISCHR(info.st_mode) && !S_ISBLK(info.st_mode))
          return fmt::format("CDI spec {}: {} is not a device node", file, device.host_path);
        device.type = S_ISBLK(info.st_mode) ? 'b' : 'c';
        device.major = static_cast<int64_t>(major(info.st_rdev));
        device.minor = static_cast<int64_t>(minor(info.st_rdev));
        device.file_mode = info.st_mode & 07777;
        out.devices.push_back(std::move(device));
      }
    }
    if (const YAML::Node mounts = edits["mounts"]) {
      for (const YAML::Node& mount : mounts) {
        ContainerBind bind;
        bind.source = mount["hostPath"].as<std::string>();
        bind.destination = mount["containerPath"].as<std::string>();
        if (const YAML::Node options = mount["options"])
          for (const YAML::Node& option : options)
            bind.options.push_back(option.as<std::string>());
        if (bind.options.empty()) bind.options = {"ro", "nosuid", "nodev", "rbind"};
        out.mounts.push_back(std::move(bind));
      }
    }
    if (const YAML::Node list = edits["hooks"]) {
      for (const YAML::Node& hook : list) {
        json entry = {{"path", hook["path"].as<std::string>()}};
        if (const YAML::Node args = hook["args"])
          entry["args"] = args.as<std::vector<std::string>>();
        if (const YAML::Node env = hook["env"]) entry["env"] = env.as<std::vector<std::string>>();
        if (const YAML::Node timeout = hook["timeout"]) entry["timeout"] = timeout.as<int>();
        hooks[hook["hookName"].as<std::string>()].push_back(std::move(entry));
      }
    }
  } catch (const YAML::Exception& error) {
    return fmt::format("CDI spec {}: {}", file, error.what());
  }
  return std::nullopt;
}

}  // namespace

std::string CdiGpuName(const GpuInfo& gpu) {
  return fmt::format("{}={}", kCdiGpuKind, gpu.uuid);
}

std::string CdiSpecForGpus(const std::vector<GpuInfo>& gpus,
                           const std::vector<std::string>& common_device_files) {
  json devices = json::array();
  for (const GpuInfo& gpu : gpus) {
    json nodes = json::array();
    for (const std::string& file : gpu.device_files)
      nodes.push_back(DeviceNodeJson(file));
    json edits = {{"deviceNodes", nodes}};
    devices.push_back({{"name", gpu.uuid}, {"containerEdits", edits}});
    if (!gpu.mig)
      devices.push_back({{"name", std::to_string(gpu.index)}, {"containerEdits", edits}});
  }
  json common_nodes = json::array();
  for (const std::string& file : common_device_files) {
    struct stat info {};
    if (::stat(file.c_str(), &info) == 0) common_nodes.push_back(DeviceNodeJson(file));
  }
  json spec = {{"cdiVersion", "0.5.0"}, {"kind", kCdiGpuKind}, {"devices", devices}};
  if (!common_nodes.empty()) spec["containerEdits"] = {{"deviceNodes", common_nodes}};
  return spec.dump(2) + "\n";
}

std::optional<std::string> ResolveCdiDevices(const std::vector<std::string>& dirs,
                                             const std::vector<std::string>& names,
                                             CdiEdits& edits) {
  if (names.empty()) return std::nullopt;
  std::map<std::string, SpecEdits> by_kind;  // a later directory's spec replaces an earlier one
  for (const std::string& dir : dirs) {
    std::error_code error;
    std::vector<fs::path> files;
    for (const auto& item : fs::directory_iterator(dir, error)) {
      const std::string extension = item.path().extension().string();
      if (extension == ".json" || extension == ".yaml" || extension == ".yml")
        files.push_back(item.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& path : files) {
      SpecEdits spec;
      spec.file = path.string();
      std::string kind;
      try {
        YAML::Node root = YAML::LoadFile(spec.file);
        kind = root["kind"].as<std::string>();
        spec.common = root["containerEdits"];
        for (const YAML::Node& device : root["devices"])
          spec.devices[device["name"].as<std::string>()] = device["containerEdits"];
      } catch (const YAML::Exception& failure) {
        return fmt::format("CDI spec {} cannot be read: {}", spec.file, failure.what());
      }
      by_kind[kind] = std::move(spec);
    }
  }
  json hooks = json::object();
  std::set<std::string> common_added;
  for (const std::string& name : names) {
    const size_t equals = name.find('=');
    if (equals == std::string::npos) return fmt::format("CDI device '{}' is not KIND=NAME", name);
    const std::string kind = name.substr(0, equals);
    const std::string device = name.substr(equals + 1);
    auto spec = by_kind.find(kind);
    if (spec == by_kind.end())
      return fmt::format("no CDI spec for kind {} in {}", kind, fmt::join(dirs, ", "));
    auto found = spec->second.devices.find(device);
    if (found == spec->second.devices.end())
      return fmt::format("CDI device {} is not in {}", name, spec->second.file);
    if (common_added.insert(kind).second)
      if (auto why = AddEdits(spec->second.common, spec->second.file, edits, hooks)) return why;
    if (auto why = AddEdits(found->second, spec->second.file, edits, hooks)) return why;
  }
  if (!hooks.empty()) edits.hooks_json = hooks.dump();
  // Two names of one GPU (its UUID and index) give one node.
  std::set<std::string> seen;
  edits.devices.erase(
      std::remove_if(edits.devices.begin(), edits.devices.end(),
                     [&](const ContainerDevice& d) { return !seen.insert(d.path).second; }),
      edits.devices.end());
  return std::nullopt;
}

std::string OciConfigJson(const ContainerPlan& plan) {
  // Docker's default set: enough for package managers and servers, not for administering the
  // node (no SYS_ADMIN, NET_ADMIN, SYS_PTRACE).
  const json capabilities = {
      "CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FSETID",           "CAP_FOWNER",
      "CAP_MKNOD",   "CAP_NET_RAW",      "CAP_SETGID",           "CAP_SETUID",
      "CAP_SETFCAP", "CAP_SETPCAP",      "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
      "CAP_KILL",    "CAP_AUDIT_WRITE"};
  const bool root = plan.uid == 0;
  json process = {{"terminal", false},
                  {"user", {{"uid", plan.uid}, {"gid", plan.gid}}},
                  {"args", plan.args},
                  {"env", plan.env},
                  {"cwd", plan.cwd.empty() ? std::string("/") : plan.cwd},
                  {"capabilities",
                   {{"bounding", capabilities},
                    {"effective", root ? capabilities : json::array()},
                    {"permitted", root ? capabilities : json::array()}}},
                  {"noNewPrivileges", true}};
  if (!plan.additional_gids.empty()) process["user"]["additionalGids"] = plan.additional_gids;

  json mounts = json::array(
      {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
       {{"destination", "/dev"},
        {"type", "tmpfs"},
        {"source", "tmpfs"},
        {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
       {{"destination", "/dev/pts"},
        {"type", "devpts"},
        {"source", "devpts"},
        {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
       {{"destination", "/dev/mqueue"},
        {"type", "mqueue"},
        {"source", "mqueue"},
        {"options", {"nosuid", "noexec", "nodev"}}},
       // The node's network namespace is shared, so sysfs cannot be mounted anew: bound, read-only.
       {{"destination", "/sys"},
        {"type", "bind"},
        {"source", "/sys"},
        {"options", {"rbind", "nosuid", "noexec", "nodev", "ro"}}}});
  json shm_options = {"nosuid", "noexec", "nodev", "mode=1777"};
  if (plan.shm_bytes > 0) shm_options.push_back(fmt::format("size={}", plan.shm_bytes));
  mounts.push_back({{"destination", "/dev/shm"},
                    {"type", "tmpfs"},
                    {"source", "shm"},
                    {"options", shm_options}});
  // Names resolve as on the node, whose network the container uses.
  for (const char* file : {"/etc/resolv.conf", "/etc/hosts"}) {
    struct stat info {};
    if (::stat(file, &info) == 0)
      mounts.push_back({{"destination", file},
                        {"type", "bind"},
                        {"source", file},
                        {"options", {"bind", "ro", "nosuid", "nodev"}}});
  }
  for (const ContainerBind& bind : plan.binds)
    mounts.push_back({{"destination", bind.destination},
                      {"type", "bind"},
                      {"source", bind.source},
                      {"options", bind.options}});

  json devices = json::array();
  json allowed = json::array({{{"allow", false}, {"access", "rwm"}}});
  for (const ContainerDevice& device : plan.devices) {
    devices.push_back({{"path", device.path},
                       {"type", std::string(1, device.type)},
                       {"major", device.major},
                       {"minor", device.minor},
                       {"fileMode", device.file_mode},
                       {"uid", 0},
                       {"gid", 0}});
    allowed.push_back({{"allow", true},
                       {"type", std::string(1, device.type)},
                       {"major", device.major},
                       {"minor", device.minor},
                       {"access", "rwm"}});
  }
  json linux_section = {
      {"namespaces", json::array({{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "mount"}}})},
      {"devices", devices},
      {"resources", {{"devices", allowed}}},
      {"maskedPaths",
       {"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
        "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"}},
      {"readonlyPaths",
       {"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}}};
  if (!plan.cgroups_path.empty()) linux_section["cgroupsPath"] = plan.cgroups_path;

  json config = {{"ociVersion", "1.0.2"},
                 {"process", process},
                 {"root", {{"path", plan.rootfs}, {"readonly", false}}},
                 {"mounts", mounts},
                 {"linux", linux_section}};
  if (!plan.hooks_json.empty()) config["hooks"] = json::parse(plan.hooks_json);
  return config.dump(2) + "\n";
}

std::optional<std::string> CgroupRelativePath(const std::string& dir,
                                              const std::string& mountinfo_path) {
  std::ifstream file(mountinfo_path);
  std::string line;
  std::string best;
  while (std::getline(file, line)) {
    // "36 35 0:30 / /sys/fs/cgroup/cpu rw,... - cgroup cgroup rw,cpu"
    const size_t separator = line.find(" - ");
    if (separator == std::string::npos) continue;
    std::istringstream after(line.substr(separator + 3));
    std::string type;
    after >> type;
    if (type != "cgroup" && type != "cgroup2") continue;
    std::istringstream fields(line.substr(0, separator));
    std::string id, parent, numbers, root, mount_point;
    fields >> id >> parent >> numbers >> root >> mount_point;
    if (dir.rfind(mount_point + "/", 0) == 0 && mount_point.size() > best.size())
      best = mount_point;
  }
  if (best.empty()) return std::nullopt;
  return dir.substr(best.size());
}

}  // namespace gpufleet::agent
