#include "agent/container_runtime.h"

#include <cstdlib>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/command_runner.h"
#include "agent/executor_files.h"
#include "agent/executor_util.h"
#include "agent/oci_spec.h"

namespace gpufleet::agent {
namespace {

// As execvp would find it in the agent's PATH.
std::optional<std::string> FindInPath(const std::string& name) {
  // A path is taken as given by ResolveCommand; here it must also be runnable.
  if (name.find('/') != std::string::npos)
    return ::access(name.c_str(), X_OK) == 0 ? std::optional<std::string>(name) : std::nullopt;
  const char* path = std::getenv("PATH");
  int err = 0;
  return executor_internal::ResolveCommand(
      name, path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "/", err);
}

// "runc version 1.1.5+ds1" / "crun version 1.8.1" -> "runc 1.1.5+ds1".
std::string VersionOf(const std::string& path, const std::string& name) {
  CommandResult version = RunCommand({path, "--version"}, 10 * kMsPerSecond);
  if (!version.ok()) return name + " (version unknown: " + version.Describe() + ")";
  std::string first = version.output.substr(0, version.output.find('\n'));
  if (size_t at = first.find("version "); at != std::string::npos)
    return name + " " + first.substr(at + 8);
  return name + " " + first;
}

}  // namespace

ContainerRuntimeConfig DetectContainerRuntime(const ContainerRuntimeOptions& options) {
  ContainerRuntimeConfig config;
  std::string crun_refused;
  std::vector<std::string> candidates;
  if (options.runtime == "auto") {
    auto controllers = executor_internal::ReadFileToString(options.cgroup2_controllers_path);
    const bool hybrid_with_controllers =
        controllers && controllers->find_first_not_of(" \n") != std::string::npos;
    if (hybrid_with_controllers)
      crun_refused = "crun refuses this node's hybrid cgroups (v2 holds controllers)";
    else
      candidates.push_back("crun");
    candidates.push_back("runc");
  } else {
    candidates.push_back(options.runtime);
  }
  for (const std::string& name : candidates) {
    if (auto path = FindInPath(name)) {
      config.runtime = *path;
      const std::string base = path->substr(path->rfind('/') + 1);
      config.runtime_description = VersionOf(*path, base);
      if (!crun_refused.empty()) config.runtime_description += "; " + crun_refused;
      break;
    }
  }
  if (config.runtime.empty()) {
    config.runtime_description =
        options.runtime == "auto"
            ? fmt::format("none: neither crun nor runc is installed{}",
                          crun_refused.empty() ? "" : " (" + crun_refused + ")")
            : fmt::format("none: --oci-runtime '{}' is not an executable", options.runtime);
    return config;
  }
  if (options.init != "none") {
    if (::access(options.init.c_str(), X_OK) != 0) {
      config.runtime.clear();
      config.runtime_description = fmt::format(
          "none: the container init '{}' is missing (install tini, or --container-init none)",
          options.init);
      return config;
    }
    config.init = options.init;
  }
  return config;
}

}  // namespace gpufleet::agent

namespace gpufleet::agent {

using executor_internal::ShimSpec;
using executor_internal::WorkloadPaths;

namespace {
constexpr const char* kInitPath = "/.gpufleet/init";
constexpr const char* kDefaultContainerWorkdir = "/gpufleet/work";
constexpr TimeMs kRuntimeCommandMs = 30 * kMsPerSecond;
}  // namespace

std::optional<std::string> PrepareContainerStart(const ShimSpec& spec, const WorkloadPaths& paths,
                                                 ContainerStart& start, const ImageLog& log) {
  const WorkloadSpec& workload = spec.workload;
  const ContainerRuntimeConfig& containers = spec.containers;
  if (containers.runtime.empty()) return "no OCI runtime on this node";

  ContainerPlan plan;
  // Checked before the image, which may take minutes: a typo should fail at once.
  for (const ContainerMount& mount : workload.container.mounts) {
    struct stat info {};
    if (::stat(mount.source.c_str(), &info) != 0)
      return fmt::format("mount source '{}' on this node: {}", mount.source,
                         executor_internal::ErrnoText(errno));
    std::vector<std::string> options = {"rbind", "nosuid", "nodev"};
    options.push_back(mount.read_only ? "ro" : "rw");
    plan.binds.push_back({mount.source, mount.target, options});
  }
  CdiEdits edits;
  if (auto why = ResolveCdiDevices(containers.cdi_dirs, workload.cdi_devices, edits))
    return "GPU devices: " + *why;

  if (auto why = PrepareImage(containers.images, workload.container.image, start.image, log))
    return why;
  auto release = [&](std::string why) {
    if (start.image.lock_fd >= 0) ::close(start.image.lock_fd);
    start.image.lock_fd = -1;
    return std::optional<std::string>(std::move(why));
  };
  CollectImageGarbage(containers.images, start.image.key, log);

  for (const std::string& dir : {paths.bundle, paths.rootfs, paths.upper, paths.overlay_work})
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return release(fmt::format("create '{}': {}", dir, executor_internal::ErrnoText(errno)));

  plan.rootfs = paths.rootfs;
  plan.env = spec.env;
  plan.env.insert(plan.env.end(), edits.env.begin(), edits.env.end());
  plan.devices = edits.devices;
  plan.binds.insert(plan.binds.end(), edits.mounts.begin(), edits.mounts.end());
  plan.hooks_json = edits.hooks_json;
  // Where the platform hands it state: the checkpoint and MPS directories keep their paths.
  for (const std::string& path : workload.isolation.keep_visible)
    plan.binds.push_back({path, path, {"rbind", "nosuid", "nodev", "rw"}});
  if (workload.workdir.empty()) {
    plan.binds.push_back(
        {paths.default_workdir, kDefaultContainerWorkdir, {"rbind", "nosuid", "nodev", "rw"}});
    plan.cwd = kDefaultContainerWorkdir;
  } else {
    plan.cwd = workload.workdir;
  }
  if (workload.run_as) {
    plan.uid = workload.run_as->uid;
    plan.gid = workload.run_as->gid;
    plan.additional_gids = workload.run_as->groups;
    if (workload.workdir.empty() && ::chown(paths.default_workdir.c_str(), plan.uid, plan.gid) != 0)
      return release(fmt::format("give '{}' to uid {}: {}", paths.default_workdir, plan.uid,
                                 executor_internal::ErrnoText(errno)));
  } else if (!workload.container.user.empty()) {
    std::string error;
    auto user = ParseContainerUser(workload.container.user, error);
    if (!user) return release(error);
    plan.uid = user->uid;
    plan.gid = user->gid.value_or(user->uid);
  }
  if (!containers.init.empty()) {
    plan.binds.push_back({containers.init, kInitPath, {"bind", "ro", "nosuid", "nodev"}});
    // -g: a signal goes to the command's whole process group, as the shim's would.
    plan.args = {kInitPath, "-g", "--"};
  }
  plan.args.insert(plan.args.end(), workload.argv.begin(), workload.argv.end());
  if (!spec.cgroup.dirs.empty()) {
    auto relative = CgroupRelativePath(spec.cgroup.dirs.front());
    if (!relative)
      return release(fmt::format("no cgroup mount holds '{}'", spec.cgroup.dirs.front()));
    plan.cgroups_path = *relative;
  }
  if (auto why = executor_internal::WriteFileAtomically(paths.bundle + "/config.json",
                                                        OciConfigJson(plan)))
    return release("write the OCI bundle: " + *why);

  start.runtime = containers.runtime;
  start.argv = {containers.runtime, "run", "--bundle", paths.bundle, spec.container_id};
  start.rootfs = paths.rootfs;
  start.bundle = paths.bundle;
  start.overlay_options = fmt::format("lowerdir={},upperdir={},workdir={}", start.image.rootfs,
                                      paths.upper, paths.overlay_work);
  start.description =
      fmt::format("container {} from {} ({}, {} device node(s), uid {})", spec.container_id,
                  workload.container.image, start.image.was_cached ? "cached" : "prepared now",
                  plan.devices.size(), plan.uid);
  return std::nullopt;
}

void KillContainer(const ShimSpec& spec) {
  RunCommand({spec.containers.runtime, "kill", spec.container_id, "KILL"}, kRuntimeCommandMs);
}

void DeleteContainer(const ShimSpec& spec) {
  RunCommand({spec.containers.runtime, "delete", "--force", spec.container_id}, kRuntimeCommandMs);
}

}  // namespace gpufleet::agent
