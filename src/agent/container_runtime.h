#pragma once

// The OCI side of the executor (docs/containers.md). A workload that names an image runs through
// an OCI runtime (runc or crun) under the same shim as a process does, so logs, cancel with its
// grace period, limits and re-adoption after an agent restart are one code path; what differs is
// how the shim starts it: it prepares the image in the node's cache, writes an OCI bundle over an
// overlay of that image, and runs `<runtime> run` as the workload's main process.

#include <optional>
#include <string>
#include <vector>

#include "agent/image_cache.h"

namespace gpufleet::agent {

struct ContainerRuntimeConfig {
  std::string runtime;  // absolute path of runc or crun; empty: containers cannot run here
  std::string runtime_description;  // "runc 1.1.5", or why there is none
  // Bound into each container as its PID 1 (tini, as `docker run --init`): it passes SIGTERM on
  // to the command and reaps orphans. Empty: the command is PID 1 itself.
  std::string init;
  ImageCacheConfig images;
  std::vector<std::string> cdi_dirs;  // read in order, a later one overriding; the last is ours
  bool available() const { return !runtime.empty(); }
};

struct ContainerRuntimeOptions {
  std::string runtime = "auto";               // auto, runc, crun, or a path
  std::string init = "/usr/bin/tini-static";  // "none": no init
  std::string cgroup2_controllers_path = "/sys/fs/cgroup/unified/cgroup.controllers";
};

// Finds the runtime and reads its version. "auto" takes crun, the lighter of the two, unless
// the node mounts cgroups as a v1/v2 hybrid with controllers on the v2 side, which crun 1.8
// refuses outright; then runc. The description says which and why.
ContainerRuntimeConfig DetectContainerRuntime(const ContainerRuntimeOptions& options);

}  // namespace gpufleet::agent

namespace gpufleet::agent::executor_internal {
struct ShimSpec;
struct WorkloadPaths;
}  // namespace gpufleet::agent::executor_internal

namespace gpufleet::agent {

// What the shim runs for a container, worked out before it forks.
struct ContainerStart {
  std::string runtime;            // executable
  std::vector<std::string> argv;  // runtime run --bundle <dir> <id>
  std::string rootfs;             // mount point of the overlay
  std::string overlay_options;    // lowerdir=...,upperdir=...,workdir=...
  std::string bundle;             // the runtime's working directory
  PreparedImage image;            // held until the container is gone
  std::string description;        // for the shim log
};

// Prepares the image (the cache's log lines go to `log`), collects the cache's garbage, resolves
// the GPUs' CDI devices and writes the bundle's config.json. Returns why the container cannot
// start; the image is released then.
std::optional<std::string> PrepareContainerStart(const executor_internal::ShimSpec& spec,
                                                 const executor_internal::WorkloadPaths& paths,
                                                 ContainerStart& start, const ImageLog& log);

// `<runtime> kill <id> KILL` and `<runtime> delete --force <id>`: after the container's main
// process is gone, or to end one whose runtime process was killed.
void KillContainer(const executor_internal::ShimSpec& spec);
void DeleteContainer(const executor_internal::ShimSpec& spec);

}  // namespace gpufleet::agent
