#pragma once

// The executor's state on disk, one directory per workload (data_dir/workloads/<id>/), shared by
// the executor and the shim. Every file is written whole (WriteFileAtomically), by one writer:
//   spec.json     executor, before the shim starts: everything the shim needs
//   shim.pid      shim, first thing: its pid and start time
//   workload.pgid shim, once the workload exec'ed: pid (== pgid), start time, start wall clock
//   cancel.json   executor, on Cancel: grace period; the shim reads it on SIGUSR1
//   status.json   shim (executor only when the shim could not be started): how it ended
//   stdout.log*, stderr.log*, shim.log, work/ (default workdir)

#include <optional>
#include <string>
#include <vector>

#include "agent/cgroups.h"
#include "agent/container_runtime.h"
#include "agent/workload.h"
#include "core/types.h"

namespace gpufleet::agent::executor_internal {

inline constexpr int kStateFormat = 1;

struct WorkloadPaths {
  std::string dir;
  std::string spec;
  std::string shim_pid;
  std::string workload_pgid;
  std::string cancel;
  std::string status;
  std::string stdout_log;
  std::string stderr_log;
  std::string shim_log;
  std::string default_workdir;
  std::string tmp;     // the workload's private TMPDIR
  std::string phase;   // what a starting workload waits for ("preparing image ..."), by the shim
  std::string bundle;  // a container's OCI bundle: config.json
  std::string rootfs;  // its root: an overlay of the cached image with `upper` on top
  std::string upper;
  std::string overlay_work;

  static WorkloadPaths For(const std::string& workload_dir);
};

// spec.json.
struct ShimSpec {
  WorkloadSpec workload;
  std::string workload_dir;
  std::string workdir;           // resolved (the default filled in)
  std::vector<std::string> env;  // final KEY=VALUE list
  WorkloadCgroup cgroup;         // empty dirs: no cgroup
  bool limits_applied = false;
  std::string limits_warning;
  TimeMs created_at_ms = 0;
  // Containers only: how to run them on this node, and the runtime's name for this one.
  ContainerRuntimeConfig containers;
  std::string container_id;
};

// shim.pid and workload.pgid.
struct ProcessRecord {
  int32_t pid = 0;
  uint64_t start_ticks = 0;
  TimeMs started_at_ms = 0;
};

// status.json.
struct FinalStatus {
  WorkloadState state = WorkloadState::kExited;  // kExited or kFailedToStart
  int32_t pid = 0;
  std::optional<int32_t> exit_code;
  std::optional<int32_t> signal;
  bool core_dumped = false;
  bool cancelled = false;
  bool timed_out = false;
  bool killed_after_grace = false;
  bool oom_killed = false;
  TimeMs started_at_ms = 0;
  TimeMs finished_at_ms = 0;
  std::string error;
  TimeMs user_cpu_ms = 0;
  TimeMs system_cpu_ms = 0;
  int64_t max_rss_kib = 0;
  int64_t log_bytes_dropped = 0;
  std::string cleanup_warning;  // e.g. the cgroup could not be removed
};

// cancel.json.
struct CancelRequest {
  TimeMs requested_at_ms = 0;
  TimeMs grace_ms = 0;
};

std::string ToJson(const ShimSpec& spec);
std::string ToJson(const ProcessRecord& record);
std::string ToJson(const FinalStatus& status);
std::string ToJson(const CancelRequest& request);

// Each returns why the text is not a valid file of its kind, or nothing.
std::optional<std::string> ParseShimSpec(const std::string& text, ShimSpec& spec);
std::optional<std::string> ParseProcessRecord(const std::string& text, ProcessRecord& record);
std::optional<std::string> ParseFinalStatus(const std::string& text, FinalStatus& status);
std::optional<std::string> ParseCancelRequest(const std::string& text, CancelRequest& request);

// Reads and parses a file: nothing when it does not exist, else the parse result.
template <typename T>
std::optional<std::string> LoadStateFile(const std::string& path, T& value, bool& exists);

}  // namespace gpufleet::agent::executor_internal
