#pragma once

// What the OCI executor writes for a container runtime (runc or crun, which share one CLI and
// the OCI runtime spec), and the Container Device Interface specs it gives GPUs by
// (docs/containers.md): the agent writes one CDI spec for the GPUs it found, and a container's
// GPUs are named to it as CDI devices ("nvidia.com/gpu=GPU-8e3f..."), resolved through every
// spec in the CDI directories, so vendor specs (nvidia-ctk's driver mounts and hooks) apply too.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/gpu_backend.h"

namespace gpufleet::agent {

inline constexpr const char* kCdiGpuKind = "nvidia.com/gpu";

// The agent's CDI spec for `gpus`: one device per GPU, named by its UUID and by its index, with
// its device files; the driver's control nodes (those of `common_device_files` that exist) go to
// every container given any of them. JSON text.
std::string CdiSpecForGpus(const std::vector<GpuInfo>& gpus,
                           const std::vector<std::string>& common_device_files);
// The CDI device name of a GPU: "nvidia.com/gpu=<uuid>".
std::string CdiGpuName(const GpuInfo& gpu);

// One device node of the container. `path` is inside it, `host_path` the node's file.
struct ContainerDevice {
  std::string path;
  std::string host_path;
  char type = 'c';  // 'c' or 'b'
  int64_t major = 0;
  int64_t minor = 0;
  uint32_t file_mode = 0666;
};

struct ContainerBind {
  std::string source;                // on the node
  std::string destination;           // in the container
  std::vector<std::string> options;  // "ro", "rbind", "nosuid", ...
};

// What CDI devices add to a container.
struct CdiEdits {
  std::vector<std::string> env;  // KEY=VALUE
  std::vector<ContainerDevice> devices;
  std::vector<ContainerBind> mounts;
  std::string hooks_json;  // an OCI "hooks" object, or empty
};

// Resolves `names` ("vendor.com/class=device") through the *.json and *.yaml specs in `dirs`, a
// later directory overriding an earlier one for the same kind; returns why not (an unknown
// device, a spec that cannot be read). Device numbers are read from the node's files.
std::optional<std::string> ResolveCdiDevices(const std::vector<std::string>& dirs,
                                             const std::vector<std::string>& names,
                                             CdiEdits& edits);

// Everything config.json says, worked out by the shim.
struct ContainerPlan {
  std::string rootfs;  // absolute
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::string cwd;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> additional_gids;
  std::vector<ContainerBind> binds;  // after the standard /proc, /dev, /sys ... mounts
  std::vector<ContainerDevice> devices;
  std::string cgroups_path;  // relative to the hierarchy roots; empty: the runtime's choice
  int64_t shm_bytes = 0;     // /dev/shm's size; 0: the kernel's default (half of memory)
  std::string hooks_json;
};

// config.json (OCI runtime spec 1.0.2): the node's network and UTS namespaces (training talks
// over the node's interfaces, replicas listen on its ports), its own mount, PID and IPC
// namespaces, Docker's default capabilities, no new privileges, the device cgroup closed to all
// but the standard nodes and `devices`.
std::string OciConfigJson(const ContainerPlan& plan);

// The cgroup path (relative to its hierarchy's mount point) of a cgroup directory, from
// /proc/self/mountinfo: "/sys/fs/cgroup/cpu/gpufleet/w1" -> "/gpufleet/w1".
std::optional<std::string> CgroupRelativePath(
    const std::string& dir, const std::string& mountinfo_path = "/proc/self/mountinfo");

}  // namespace gpufleet::agent
