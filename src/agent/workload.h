#pragma once

// What the executor runs (WorkloadSpec) and what it reports (WorkloadStatus).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/cgroups.h"
#include "agent/log_rotation.h"
#include "core/container.h"
#include "core/types.h"

namespace gpufleet::agent {

inline constexpr TimeMs kDefaultGracePeriodMs = 30 * kMsPerSecond;

// One process tree on this machine: usually one task of a job.
// The Unix identity a workload runs as, when not the agent's own.
struct WorkloadUser {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // supplementary; empty: none
  std::string name;              // for people: "nobody", "uid 200042 (job 42)"
};

// What fences a workload off from the rest of the node beyond its user and cgroup: a mount
// namespace of its own, which needs the agent to be root (CAP_SYS_ADMIN).
struct WorkloadIsolation {
  // The namespace gives it its own /tmp and /var/tmp (its private tmp directory), a fresh
  // /dev/shm, and covers hidden_devices with an unreadable file. Paths it needs that lie under
  // /tmp or /var/tmp (its workdir, its directory, keep_visible) are bound back in place.
  bool mount_namespace = false;
  std::vector<std::string> hidden_devices;  // other GPUs' device files: /dev/nvidia3
  std::vector<std::string> keep_visible;    // e.g. the checkpoint and MPS pipe directories
};

struct WorkloadSpec {
  // Unique on this agent and used as a directory and cgroup name: [A-Za-z0-9_.-], 1..128
  // characters, not starting with '.'.
  std::string id;
  JobId job_id = 0;               // exported as GPUFLEET_JOB_ID
  int32_t task_index = 0;         // exported as GPUFLEET_TASK_INDEX
  std::vector<std::string> argv;  // argv[0] is looked up in the workload's PATH when it has no '/'
  // The workload's environment: these entries, a default PATH when they set none, and ours
  // (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPUFLEET_*), which win.
  // Nothing is inherited from the agent.
  std::map<std::string, std::string> env;
  std::string workdir;  // absolute; empty = a "work" directory inside the workload's directory
  std::vector<int32_t> gpu_indices;    // NVML/PCI-order indices on this node
  std::vector<std::string> gpu_uuids;  // same order as gpu_indices, or empty
  // Of each GPU: kMilliPerGpu holds it whole; less shares it with other workloads.
  MilliGpu gpu_milli = kMilliPerGpu;
  // A share only: how it is held (GpuSharingModeName: "mps", "recorded", "advisory") and its
  // limits, of the SMs and of each GPU's memory in gpu_indices' order.
  std::string gpu_sharing;
  int gpu_compute_percent = 0;
  std::vector<MiB> gpu_memory_limit_mib;
  MilliCpu cpu_milli = 0;                       // CPU quota; 0 = no limit
  MiB memory_mib = 0;                           // memory limit; 0 = no limit
  TimeMs grace_period = kDefaultGracePeriodMs;  // SIGTERM -> SIGKILL on cancel and timeout
  TimeMs max_runtime = 0;  // from start to SIGTERM (then the grace period); 0 = unlimited
  LogLimits logs;
  // Set: the workload runs as this user, with no new privileges (setuid binaries do not raise
  // them), its default workdir and private TMPDIR owned by it and closed to others. Unset: as
  // the agent.
  std::optional<WorkloadUser> run_as;
  WorkloadIsolation isolation;  // processes only: a container is isolated by its runtime
  // An image: the workload runs in a container from it (docs/containers.md), its argv resolved
  // in the image, workdir a path inside it. run_as, when set, is the user inside.
  ContainerSpec container;
  std::vector<std::string> cdi_devices;  // a container's GPUs: "nvidia.com/gpu=GPU-..."
};

// Returns why the spec cannot be run, or nothing.
std::optional<std::string> ValidateWorkloadSpec(const WorkloadSpec& spec);

enum class WorkloadState {
  kStarting,       // the shim is starting it
  kRunning,        // its process runs under a live shim
  kExited,         // it ended; exit_code or signal says how
  kFailedToStart,  // it never ran (bad command, missing workdir, ...); error says why
  kLost,           // its shim died without recording an end; error says what is known
};

std::string_view WorkloadStateName(WorkloadState state);
std::optional<WorkloadState> ParseWorkloadState(std::string_view name);

struct WorkloadStatus {
  std::string id;
  WorkloadState state = WorkloadState::kStarting;
  int32_t pid = 0;   // the workload's main process; 0 before it started
  int32_t pgid = 0;  // its process group (== pid): what Cancel signals
  int32_t shim_pid = 0;

  std::optional<int32_t> exit_code;  // exited normally
  std::optional<int32_t> signal;     // killed by this signal
  bool core_dumped = false;
  bool cancelled = false;           // Cancel was requested before it ended
  bool timed_out = false;           // max_runtime expired before it ended
  bool killed_after_grace = false;  // it outlived the grace period and got SIGKILL
  bool oom_killed = false;          // the kernel OOM-killed a process in its cgroup

  TimeMs started_at_ms = 0;   // wall clock, ms since the Unix epoch; 0 = not started
  TimeMs finished_at_ms = 0;  // 0 = not finished
  std::string error;          // failed_to_start and lost: why; otherwise empty

  CgroupVersion cgroup_version = CgroupVersion::kNone;
  std::vector<std::string> cgroup_paths;  // v2: one directory; v1: the cpu and memory ones
  bool limits_applied = false;            // cpu/memory limits were written to its cgroup
  std::string limits_warning;             // why limits were not applied, when asked for

  std::string stdout_log;  // live files; rotated ones are "<path>.1" ... (newest first)
  std::string stderr_log;
  int64_t log_bytes_dropped = 0;  // output lost to failed log writes

  TimeMs user_cpu_ms = 0;  // of the main process and its reaped descendants, once it ended
  TimeMs system_cpu_ms = 0;
  int64_t max_rss_kib = 0;

  bool Finished() const {
    return state == WorkloadState::kExited || state == WorkloadState::kFailedToStart;
  }
};

}  // namespace gpufleet::agent
